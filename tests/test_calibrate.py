"""Calibration measures real steps of the engine and fits a cost model that predicts them."""

from __future__ import annotations

import pytest

from simulation import calibrate as calibrate_module
from simulation.calibrate import GridPoint, build_step, calibrate, grid
from tests.conftest import assert_no_kv_leak, make_engine


def test_grid_fits_the_pool_and_budget():
    points = grid(max_kv_blocks=100, block_size=16, max_tokens=256, num_points=500)
    assert points and all(p.kv_blocks(16) <= 100 and p.decodes + p.chunk <= 256 for p in points)
    assert any(p.decodes and p.chunk for p in points)          # mixed steps are measured too


def test_calibrate_a_tiny_model(tiny_hf, monkeypatch):
    monkeypatch.setattr(calibrate_module, "MAX_RETAKES", 0)   # a busy test machine must not slow it down
    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    model = calibrate(engine, num_points=12, repeats=1, holdout_fraction=0.25, progress=False, live_requests=4)
    assert len(model.coefficients) == 7 and all(c >= 0 for c in model.coefficients)
    assert model.num_samples >= 9 and model.holdout_mape is not None
    assert model.kv_blocks == 4096 and model.block_size == 16
    assert_no_kv_leak(engine)


def test_a_built_step_holds_exactly_its_blocks(tiny_hf):
    engine = make_engine(tiny_hf[0], num_kv_blocks=256, block_size=4)
    point = GridPoint(decodes=3, decode_context=10, chunk=5, chunk_context=6)
    scheduled = build_step(engine, point)
    assert 256 - engine.block_manager.num_free_blocks == point.kv_blocks(4)
    assert [s.is_decode for s in scheduled] == [True, True, True, False]
    for s in scheduled:
        engine.block_manager.free(s.request.block_table)


def test_the_daemon_uses_only_a_cost_model_of_its_own_machine(tiny_hf, monkeypatch, tmp_path):
    """A calibration from another machine (a fake fingerprint) is passed over: the daemon calibrates
    at start-up, or with --no-calibrate says it runs on the shipped model's shape at the live speed."""
    from simulation import startup_cost_model
    from simulation.cost_model import CostModel
    from simulation.live_cost_model import UNCALIBRATED_RANGE, LiveCostModel

    monkeypatch.setattr(calibrate_module, "MAX_RETAKES", 0)
    monkeypatch.setattr(startup_cost_model, "START_UP_GRID_S", 0.0)        # the fewest points: a test, not a fit
    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    meta = calibrate_module.engine_meta(engine)
    elsewhere = CostModel((0.5,) + (0.0,) * 6, **(meta | {"fingerprint": "cpu: another machine, 64 cores, amx_tile"}))
    elsewhere.save(tmp_path / "cost_models" / "elsewhere.json")

    skipped = startup_cost_model.choose_cost_model(engine, str(tmp_path), calibrate_at_start=False)
    assert not skipped.describes_machine and "--no-calibrate" in skipped.source
    assert skipped.model.model != meta["model"]                             # the shipped SmolLM2 fit
    assert LiveCostModel(skipped.model, skipped.source, False).speed_range == UNCALIBRATED_RANGE

    calibrated = startup_cost_model.choose_cost_model(engine, str(tmp_path))
    assert calibrated.describes_machine and calibrated.source.startswith("calibrated at start-up")
    assert calibrated.model.fingerprint == meta["fingerprint"] and calibrated.model.model == meta["model"]
    assert_no_kv_leak(engine)

    again = startup_cost_model.choose_cost_model(engine, str(tmp_path))    # the saved one is found next time
    assert again.describes_machine and again.model == calibrated.model and "start-up" not in again.source


@pytest.fixture(scope="module")
def q8_gguf(tiny_hf, tmp_path_factory):
    """The tiny Llama as a GGUF whose linear layers are Q8_0 (kept quantized by the engine)."""
    from gguf import GGMLQuantizationType as T

    from tests.gguf_writer import write_gguf
    path = str(tmp_path_factory.mktemp("q8gguf") / "tiny-q8.gguf")
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    write_gguf(tiny_hf[1], path, {f"{n}.weight": int(T.Q8_0) for n in names})
    return path


def test_a_quantized_engine_is_calibrated_per_path_and_matched_by_weights(q8_gguf, monkeypatch, tmp_path):
    """Steps on the kernels and steps above the crossover get their own coefficients; the weights are
    part of what a calibration describes, so a dense one does not price a quantized engine."""
    from simulation import startup_cost_model
    from simulation.cost_model import CostModel

    monkeypatch.setattr(calibrate_module, "MAX_RETAKES", 0)
    engine = make_engine(q8_gguf, num_kv_blocks=4096, block_size=16, weights="quantized", quantized_max_rows=8)
    assert engine.runner.weights == "quantized" and engine.runner.quantized_max_rows == 8
    dense = make_engine(q8_gguf, weights="dense")
    assert dense.runner.weights == "dense" and dense.runner.quantized_max_rows == 0
    # 73,728 layer weights in Q8_0 (34 bytes a block of 32) and the fp32 LM head (300 x 64), against all in fp32
    assert engine.runner.stored_linear_bytes() == 73_728 * 34 // 32 + 19_200 * 4
    assert dense.runner.stored_linear_bytes() == (73_728 + 19_200) * 4
    model = calibrate(engine, num_points=30, repeats=1, holdout_fraction=0.2, progress=False, live_requests=2)
    assert model.weights == "quantized" and model.kernel_max_rows == 8 and len(model.kernel_coefficients) == 7
    assert_no_kv_leak(engine)

    meta = calibrate_module.engine_meta(engine)
    fake = (0.5,) + (0.0,) * 6
    CostModel(fake, kernel_coefficients=fake, **(meta | {"weights": "dense"})).save(   # all but the weights match
        tmp_path / "cost_models" / "dense.json")
    dense_only = startup_cost_model.choose_cost_model(engine, str(tmp_path), calibrate_at_start=False)
    assert not dense_only.describes_machine
    model.save(tmp_path / "cost_models" / "quantized.json")
    chosen = startup_cost_model.choose_cost_model(engine, str(tmp_path), calibrate_at_start=False)
    assert chosen.describes_machine and chosen.model == model


def test_the_crossover_is_measured_on_whole_steps(q8_gguf, monkeypatch):
    """The kernels keep every step size up to the first one where dense + GEMM is faster."""
    engine = make_engine(q8_gguf, num_kv_blocks=4096, block_size=16, weights="quantized", quantized_max_rows=1)

    def fake_measure(engine, point, repeats, retakes=None):
        on_kernels = point.decodes <= engine.runner.quantized_max_rows
        faster = on_kernels == (point.decodes <= 16)
        return None, 0.01 if faster else 0.02
    monkeypatch.setattr(calibrate_module, "measure", fake_measure)
    assert calibrate_module.measure_step_crossover(engine, repeats=1) == 16
    assert engine.runner.quantized_max_rows == 16
