"""Calibration measures real steps of the engine and fits a cost model that predicts them."""

from __future__ import annotations

from autotuner import calibrate as calibrate_module
from autotuner.calibrate import GridPoint, build_step, calibrate, grid
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
