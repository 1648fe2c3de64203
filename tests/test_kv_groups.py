"""Sliding-window layers' KV in pages per layer group (engine/kv_cache/kv_groups.py): the grouping, the page
counts, the pool giving pages back as a window passes, and an engine that holds fewer pages for the same tokens."""

from __future__ import annotations

import torch

from engine.kv_cache.block_manager import BlockManager
from engine.kv_cache.kv_groups import NULL_PAGE, KvGroups
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Request
from tests.conftest import assert_no_kv_leak, make_engine, save_hf_model
from tests.test_families import GEMMA3
from tests.test_hf_equivalence import run_all


def gemma_layers(num_layers: int, pattern: int = 6) -> list[bool]:
    return [(i + 1) % pattern != 0 for i in range(num_layers)]   # every 6th layer global


def test_grouping_of_gemma_3_270m_and_1b():
    g = KvGroups.of(gemma_layers(18), 512, 16)                        # 3 global, 15 sliding
    assert (g.lanes, g.num_full, g.num_sliding) == (3, 1, 5)
    assert [g.layer_slots[i] for i in (5, 11, 17)] == [(0, 0), (0, 1), (0, 2)]
    assert [g.layer_slots[i] for i in (0, 1, 2, 3, 4, 6)] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    g = KvGroups.of(gemma_layers(26), 512, 16)                        # 4 global, 22 sliding
    assert (g.lanes, g.num_full, g.num_sliding) == (2, 2, 11)
    assert KvGroups.of([False] * 4, None, 16) is None and KvGroups.of([True, False], None, 16) is None


def test_pages_for_a_request():
    g = KvGroups.of([False, True, True], 8, 4)                        # 1 global, 2 sliding groups of 1 lane
    assert g.pages_for(0, 5) == 2 + 2 * 2                             # all blocks while inside the window
    assert g.first_kept_block(20) == 3                                # position 20 reads keys 13.. (block 3)
    assert g.pages_for(20, 21) == 6 + 2 * (6 - 3)
    assert g.peak_pages(100, 8) == g.pages_for(92, 100) == 25 + 2 * (25 - 21)


def test_the_pool_takes_pages_back_as_the_window_passes():
    g = KvGroups.of([False, True, True], 8, 4)
    pool = BlockManager(64, 4, g)
    r = Request("r", list(range(3, 40)), SamplingParams(max_tokens=8), 0.0)
    for end in range(8, 45, 8):          # chunks of 8 tokens, each step's blocks first, then the commit
        pool.grow_request(r, end)
        r.num_computed_tokens = end
        pool.slide(r)
        held = 64 - pool.num_free_blocks
        assert held == r.num_blocks == g.pages_for(end, end)
        first = g.first_kept_block(end)
        assert all(t[:first] == [NULL_PAGE] * first and NULL_PAGE not in t[first:] for t in r.group_tables)
    assert r.num_blocks == 10 + 2 * (10 - 8) < 3 * 10                # 40 tokens: 14 pages, not 30
    pool.release(r)
    assert pool.num_free_blocks == 64 and r.num_blocks == 0


def test_a_gemma3_engine_holds_fewer_pages_for_the_same_tokens(tmp_path):
    """Tiny Gemma 3 (window 8, 1 global and 5 sliding layers): the same greedy tokens with and without
    giving pages back, and at the end of a 60-token request the pool holds its global pages and a
    window's sliding ones, not every layer's every block."""
    save_hf_model(tmp_path, "gemma3", **GEMMA3)
    prompts = [torch.randint(3, 300, (40 + 7 * i,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(3)]
    held = {}
    tokens = {}
    for hybrid in (True, False):
        engine = make_engine(str(tmp_path), num_kv_blocks=64, block_size=4, token_budget=16, hybrid_kv_cache=hybrid)
        peak = [0]
        engine.step_listeners.append(lambda r, e=engine: peak.__setitem__(
            0, max(peak[0], e.block_manager.num_blocks - e.block_manager.num_free_blocks)))
        tokens[hybrid] = run_all(engine, prompts, 20)
        held[hybrid] = peak[0] * (1 if hybrid else 6)   # layer-blocks: a page is one layer's block here
        assert_no_kv_leak(engine)
    assert tokens[True] == tokens[False]
    assert held[True] < 0.5 * held[False], held


def test_a_windowed_step_shape_counts_the_keys_its_sliding_layers_read():
    from policies.step_shape import WindowedShape, attended_pairs

    half = WindowedShape(window=8, share=0.5)            # half the layers slide over 8 keys
    assert half.context_tokens(1, 99) == round(0.5 * 100 + 0.5 * 8)             # a decode reads its window
    assert half.attended_pairs(1, 99) == round(0.5 * 100 + 0.5 * 8)
    assert half.context_tokens(4, 2) == 6 and half.attended_pairs(4, 2) == attended_pairs(4, 2)   # inside it
    # a 10-token first chunk: queries 1..8 see 1..8 keys, 9 and 10 see 8 each
    assert half.attended_pairs(10, 0) == round(0.5 * 55 + 0.5 * (36 + 16))


def test_the_simulator_of_a_windowed_engine_runs_on_its_pages_and_shapes(tmp_path):
    """A cost model of an engine with sliding layers records them (simulation.cost_model.window_fields) and
    survives its file; the simulator then pools pages per layer group, prices windowed step shapes and
    steps through decodes (no coasting), and gives every page back."""
    from loadgen.workload import RequestSpec
    from simulation.calibrate import engine_meta
    from simulation.cost_model import FEATURES, CostModel
    from simulation.simulator import Simulator

    save_hf_model(tmp_path, "gemma3", **GEMMA3)
    engine = make_engine(str(tmp_path), num_kv_blocks=32, block_size=4)
    meta = engine_meta(engine)
    assert meta["layer_sliding"] == (True,) * 5 + (False,) and meta["window"] == 8 and meta["kv_pages"]
    cost = CostModel.load(CostModel((0.01,) + (0.0,) * (len(FEATURES) - 1), **meta).save(tmp_path / "m.json"))
    sim = Simulator(cost, cost.kv_blocks, cost.block_size)
    assert sim.blocks.groups == engine.runner.kv_groups and not sim.coast
    steps = []
    sim.step_listeners.append(steps.append)
    sim.submit([RequestSpec(0.0, 40, 30, None), RequestSpec(0.0, 30, 30, None)])
    sim.run()
    assert sim.done and sim.blocks.num_free_blocks == sim.blocks.num_blocks
    last = steps[-1]            # the last decodes, at contexts 68 and 58: 69 and 59 keys in 1 layer of 6, 8 in 5
    assert last.num_decode_tokens == 2 and last.context_tokens == round(69 / 6 + 40 / 6) + round(59 / 6 + 40 / 6)
    plain = CostModel.load(CostModel((0.01,) + (0.0,) * 6, kv_blocks=32, block_size=4).save(tmp_path / "p.json"))
    assert plain.kv_groups() is None and plain.step_shape() is None and Simulator(plain, 32, 4).coast
