"""The CUDA path on a GPU: Triton attention against torch at real model shapes, the Llama presets in bf16
(random weights), the KV pool sized from GPU memory, and CUDA graphs against eager steps.

Skipped without a GPU (CI has none); run on one with `pytest tests/test_cuda_engine.py`.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")

from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from policies import Knobs  # noqa: E402
from tests.attention_layouts import make_layout  # noqa: E402

PRESETS = ["llama-3.2-1b", "llama-3.1-8b"]
PROMPTS = [[(7 * i + 3 * j) % 1000 + 10 for j in range(40 + 17 * i)] for i in range(8)]


def free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("head_dim,heads,kv_heads", [(128, 32, 8), (64, 32, 8)])
def test_triton_matches_torch_at_real_shapes(head_dim, heads, kv_heads):
    """Llama-3.1-8B's and Llama-3.2-1B's head shapes, 16-token blocks, bf16, contexts up to ~1,500."""
    from engine.attention.backends import TorchAttention
    from engine.attention.triton_attention import TritonAttention

    rng = np.random.default_rng(0)
    layout, num_blocks = make_layout([1500, 700, 33, 0, 0, 900], [1, 1, 1, 512, 200, 300], 3, 16, rng)
    g = torch.Generator(device="cuda").manual_seed(0)
    t, slots = layout.num_tokens, num_blocks * 16
    q = torch.randn(t, heads, head_dim, generator=g, device="cuda").bfloat16()
    k, v = (torch.randn(t, kv_heads, head_dim, generator=g, device="cuda").bfloat16() for _ in range(2))
    cache = torch.randn(2, slots, kv_heads, head_dim, generator=g, device="cuda").bfloat16()
    # the reference: the torch backend in fp32 on the CPU (the same bf16 inputs, upcast)
    ref_k, ref_v = cache[0].float().cpu(), cache[1].float().cpu()
    ref = TorchAttention(head_dim ** -0.5).attend(q.float().cpu(), k.float().cpu(), v.float().cpu(), ref_k, ref_v,
                                                  TorchAttention(1.0).prepare(layout, torch.device("cpu")))
    triton = TritonAttention(head_dim ** -0.5)
    k_cache, v_cache = cache[0].clone(), cache[1].clone()
    out = triton.attend(q, k, v, k_cache, v_cache, triton.prepare(layout, torch.device("cuda")))
    torch.testing.assert_close(out.float().cpu(), ref, atol=2e-2, rtol=2e-2)
    assert torch.equal(k_cache.float().cpu(), ref_k) and torch.equal(v_cache.float().cpu(), ref_v)


def greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
           for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
    return [done[i] for i in ids]


def decode_logits(engine: LLMEngine, prompts: list[list[int]]) -> torch.Tensor:
    """The logits of the first all-decode step after the prompts are prefilled, rows in request order."""
    ids = [engine.add_request(p, SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)) for p in prompts]
    for _ in range(100):
        engine.step(return_logits=True)
        record = engine.last_record
        if record.num_prefill_tokens == 0 and record.num_decode_tokens == len(prompts):
            for request_id in ids:
                engine.abort(request_id)
            return engine.last_logits
    raise AssertionError("no all-decode step in 100 steps")


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_sizes_pool_from_gpu_memory_and_serves(preset):
    engine = LLMEngine(EngineConfig(model=preset, dtype="bf16", device="cuda", gpu_memory_utilization=0.5,
                                    knobs=Knobs(token_budget=512)))
    total = torch.cuda.mem_get_info()[1]
    pool_bytes = engine.runner.kv_cache.numel() * engine.runner.kv_cache.element_size()
    assert engine.block_manager.num_blocks * 16 >= engine.max_model_len
    # the pool is what is left of half the GPU: everything allocated stays under it (graphs aside, ~1%)
    assert torch.cuda.memory_allocated() <= 0.5 * total * 1.02
    assert pool_bytes >= 0.5 * total - engine.runner.stored_linear_bytes() - 5 * 2**30
    assert engine.runner.decode_graphs is not None
    outputs = greedy(engine, PROMPTS)
    assert all(len(o) == 12 for o in outputs)
    del engine
    free_gpu()


@pytest.mark.parametrize("preset", PRESETS)
def test_cuda_graphs_match_eager(preset):
    """Same weights (one seed), graphs on and off: the same greedy tokens for one sequence (graph of 1), close
    logits for 8 (graph of 8) and for 5 sequences riding in the graph of 8 (cuBLAS may pick other kernels)."""
    results = {}
    for graphs in (True, False):
        engine = LLMEngine(EngineConfig(model=preset, dtype="bf16", device="cuda", num_kv_blocks=2048,
                                        cuda_graphs=graphs, knobs=Knobs(token_budget=512)))
        assert (engine.runner.decode_graphs is not None) == graphs
        results[graphs] = (greedy(engine, PROMPTS[:1]), decode_logits(engine, PROMPTS),
                           decode_logits(engine, PROMPTS[:5]))
        del engine
        free_gpu()
    (one_g, eight_g, five_g), (one_e, eight_e, five_e) = results[True], results[False]
    assert one_g == one_e
    torch.testing.assert_close(eight_g, eight_e, atol=0.02, rtol=0.02)
    torch.testing.assert_close(five_g, five_e, atol=0.05, rtol=0.05)


def test_gpu_backends_match_the_cpu_reference(tmp_path):
    """One small random HF Llama (same weights everywhere), mixed steps (a 64-token budget chunks the prompts
    beside decodes): every step's logits on the GPU in bf16, under Triton (graphs and eager) and under the torch
    backend, against the CPU's fp32 torch backend, per request while its tokens agree (tests/step_trace.py: a
    near tie that bf16 flips ends a request's comparison, not the test)."""
    from tests.conftest import save_hf_model
    from tests.step_trace import errors_while_histories_agree, trace_steps

    save_hf_model(tmp_path, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
    prompts = [[t % 990 + 5 for t in p] for p in PROMPTS[:5]]
    setups = {"cpu": dict(device="cpu", dtype="fp32", attention_backend="torch"),
              "triton": dict(device="cuda", dtype="bf16", attention_backend="triton"),
              "triton-eager": dict(device="cuda", dtype="bf16", attention_backend="triton", cuda_graphs=False),
              "torch": dict(device="cuda", dtype="bf16", attention_backend="torch")}
    traces = {}
    for name, setup in setups.items():
        engine = LLMEngine(EngineConfig(model=str(tmp_path), num_kv_blocks=256, knobs=Knobs(token_budget=64), **setup))
        traces[name] = trace_steps(engine, prompts)
        del engine
        free_gpu()
    ref = traces.pop("cpu")
    for name, trace in traces.items():
        rows = errors_while_histories_agree(trace, ref)
        # bf16 against fp32 is ~0.02 here (on the CPU too); a wrong backend is off by ~1
        assert max(r.error for r in rows) < 0.08, (name, max(rows, key=lambda r: r.error))
        mixed = [r for r in rows if not r.all_decode and r.step > 0]
        assert len(mixed) >= 5 and sum(r.all_decode for r in rows) >= 20, (name, len(mixed), len(rows))
