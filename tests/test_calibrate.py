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
    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    meta = calibrate_module.engine_meta(engine)
    elsewhere = CostModel((0.5,) + (0.0,) * 6, **(meta | {"fingerprint": "cpu: another machine, 64 cores, amx_tile"}))
    elsewhere.save(tmp_path / "cost_models" / "elsewhere.json")

    skipped = startup_cost_model.choose_cost_model(engine, str(tmp_path), calibrate_at_start=False)
    assert not skipped.describes_machine and "--no-calibrate" in skipped.source
    assert skipped.model.model != meta["model"]                             # the shipped SmolLM2 fit
    assert LiveCostModel(skipped.model, skipped.source, False).speed_range == UNCALIBRATED_RANGE

    calibrated = startup_cost_model.choose_cost_model(engine, str(tmp_path), budget_s=3.0)   # a test, not a fit
    assert calibrated.describes_machine and calibrated.source.startswith("calibrated at start-up")
    assert calibrated.model.fingerprint == meta["fingerprint"] and calibrated.model.model == meta["model"]
    assert_no_kv_leak(engine)

    again = startup_cost_model.choose_cost_model(engine, str(tmp_path))    # the saved one is found next time
    assert again.describes_machine and again.model == calibrated.model and "start-up" not in again.source
    assert calibrated.model.verify_rows is not None                         # drafted rows priced by measured steps


def test_a_saved_calibration_without_verification_steps_gets_them_at_start_up(tiny_hf, tmp_path):
    from simulation import startup_cost_model
    from simulation.cost_model import CostModel

    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    path = tmp_path / "cost_models" / "old.json"
    CostModel((0.01,) + (0.0,) * 6, **calibrate_module.engine_meta(engine)).save(path)
    assert CostModel.load(path).verify_rows is None
    chosen = startup_cost_model.choose_cost_model(engine, str(tmp_path))
    assert chosen.source == str(path) and chosen.model.verify_rows is not None
    assert chosen.model.coefficients == (0.01,) + (0.0,) * 6            # the calibration itself is kept
    assert CostModel.load(path).verify_rows == chosen.model.verify_rows
    assert_no_kv_leak(engine)


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

    def fake_measure(engine, point, repeats, retakes=None, warmup=True):
        on_kernels = point.decodes <= engine.runner.quantized_max_rows
        faster = on_kernels == (point.decodes <= 16)
        return None, 0.01 if faster else 0.02
    monkeypatch.setattr(calibrate_module, "measure", fake_measure)
    assert calibrate_module.measure_step_crossover(engine, repeats=1) == 16
    assert engine.runner.quantized_max_rows == 16


def test_a_grid_point_knows_its_shape_unbuilt(tiny_hf):
    """GridPoint.shape() is what the built step computes: the budget prices points before measuring them."""
    from engine.scheduling.scheduler import ScheduleResult
    from simulation.cost_model import StepShape

    engine = make_engine(tiny_hf[0], num_kv_blocks=256, block_size=4)
    for point in (GridPoint(3, 10, 5, 6), GridPoint(0, 32, 8, 0), GridPoint(2, 32, 0, 0)):
        scheduled = build_step(engine, point)
        assert point.shape() == StepShape.of_schedule(ScheduleResult.of(scheduled, 0, engine.scheduler.knobs, "t"))
        for s in scheduled:
            engine.block_manager.free(s.request.block_table)


@pytest.fixture
def one_thread():
    """On a loaded test machine a multi-threaded step of the tiny model stalls for a time slice (~0.17 s
    measured), which would drown the known times of the slow steps below: one thread has no barrier."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def slow_steps(engine, monkeypatch, scale: float) -> None:
    """Every step of the engine (grid points and live steps) takes a known, slow time on top of the tiny
    model's milliseconds: `scale` x (20 ms + 0.2 ms a token + 1 us a context token)."""
    import time

    execute = engine.runner.execute

    def slow(scheduled, *args, **kwargs):
        tokens = sum(s.num_tokens for s in scheduled)
        context = sum(s.context_len + s.num_tokens for s in scheduled)
        time.sleep(scale * (0.02 + 2e-4 * tokens + 1e-6 * context))
        return execute(scheduled, *args, **kwargs)
    monkeypatch.setattr(engine.runner, "execute", slow)


def budgeted(tiny_hf, monkeypatch, scale: float, budget_s: float):
    import time

    from simulation.budgeted_calibration import calibrate_within

    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    slow_steps(engine, monkeypatch, scale)
    start = time.monotonic()
    model = calibrate_within(engine, budget_s, num_points=60, live_requests=4)
    assert_no_kv_leak(engine)            # live requests cut at the budget are aborted, their blocks freed
    return model, time.monotonic() - start


def test_a_slow_model_is_calibrated_within_the_budget(tiny_hf, monkeypatch, one_thread):
    """Steps of 20-300 ms would take ~20 s for 60 grid points: the budget of 4 s measures fewer, and
    the fit on them predicts the steps."""
    from simulation.cost_model import StepShape

    model, took = budgeted(tiny_hf, monkeypatch, 1.0, budget_s=4.0)
    assert took <= 4.0 + 1.0
    assert 8 <= int(model.notes["grid_points"]) < 60
    assert len(model.coefficients) == 7 and all(c >= 0 for c in model.coefficients)
    for prefill, decode, context in ((0, 1, 100), (0, 16, 3000), (256, 0, 256), (128, 8, 1500)):
        shape = StepShape(prefill, decode, decode + (prefill > 0), context, 0, decode + (prefill > 0))
        truth = 0.02 + 2e-4 * (prefill + decode) + 1e-6 * context
        assert model.predict(shape) == pytest.approx(truth, rel=0.4)


def test_the_grid_shrinks_when_points_are_slow(tiny_hf, monkeypatch, one_thread):
    fast, _ = budgeted(tiny_hf, monkeypatch, 0.2, budget_s=3.0)
    slow, took = budgeted(tiny_hf, monkeypatch, 1.5, budget_s=3.0)
    assert took <= 3.0 + 1.0
    assert int(slow.notes["grid_points"]) < int(fast.notes["grid_points"]) / 2


def test_the_kernels_crossover_is_measured_within_its_share_of_the_budget(q8_gguf, monkeypatch, one_thread):
    """Dense steps of a quantized engine cost ~0.2 s (dequantizing, on a big model): the crossover's
    row counts stop at a quarter of the budget, and the start-up's per-matrix guess stands."""
    import time

    from simulation import budgeted_calibration

    engine = make_engine(q8_gguf, num_kv_blocks=4096, block_size=16, weights="quantized")
    guess = engine.runner.quantized_max_rows
    execute = engine.runner.execute

    def slow(scheduled, *args, **kwargs):
        tokens = sum(s.num_tokens for s in scheduled)
        on_kernels = tokens <= engine.runner.quantized_max_rows
        time.sleep(0.005 + 2e-4 * tokens if on_kernels else 0.2 + 1e-5 * tokens)
        return execute(scheduled, *args, **kwargs)
    monkeypatch.setattr(engine.runner, "execute", slow)
    crossover_end = []
    measure_grid = budgeted_calibration._measure_into
    monkeypatch.setattr(budgeted_calibration, "_measure_into",
                        lambda *a: (crossover_end.append(time.monotonic()), measure_grid(*a)))
    start = time.monotonic()
    model = budgeted_calibration.calibrate_within(engine, 4.0, num_points=60, live_requests=2)
    assert time.monotonic() - start <= 4.0 + 1.0
    assert crossover_end[0] - start <= 0.25 * 4.0 + 0.6       # a pair of row counts past its share at most
    if guess > 16:   # not all row counts up to the guess could be measured in 1 s: the guess stands
        assert engine.runner.quantized_max_rows == guess == model.kernel_max_rows
    assert_no_kv_leak(engine)


def test_too_short_a_budget_falls_back_to_the_shipped_model_at_the_live_speed(tiny_hf, monkeypatch, tmp_path,
                                                                              one_thread):
    """Steps of ~0.5 s in a 2 s budget: too few grid points to fit on, so the daemon serves as with
    --no-calibrate, says why, and saves nothing (the next start tries again)."""
    import time

    from simulation import startup_cost_model

    engine = make_engine(tiny_hf[0], num_kv_blocks=4096, block_size=16)
    slow_steps(engine, monkeypatch, 25.0)
    start = time.monotonic()
    choice = startup_cost_model.choose_cost_model(engine, str(tmp_path), budget_s=2.0)
    assert time.monotonic() - start <= 2.0 + 1.5
    assert not choice.describes_machine and "too short" in choice.source
    assert not list(tmp_path.glob("cost_models/*.json"))
    assert_no_kv_leak(engine)


def test_point_costs_are_learnt_per_weights_path():
    """The estimate that decides which points fit: the shipped shape, its linear and attention parts
    scaled to what was measured; the dense path of a quantized engine apart from its kernels'."""
    from simulation.budgeted_calibration import PointCost
    from simulation.cost_model import StepShape
    from simulation.cost_model_files import SHIPPED_COST_MODEL
    from simulation.cost_model import CostModel

    prior = CostModel.load(SHIPPED_COST_MODEL)
    cost = PointCost(prior, kernel_max_rows=16)
    one = GridPoint(1, 32, 0, 0).shape()
    assert cost.predict(one) == pytest.approx(prior.predict(one))    # nothing measured: the shipped fit
    for point in (GridPoint(1, 32, 0, 0), GridPoint(8, 2048, 0, 0), GridPoint(0, 32, 16, 0), GridPoint(2, 512, 8, 256)):
        cost.observe(point.shape(), 3.0 * prior.predict(point.shape()))          # 3x slower here
    assert cost.predict(GridPoint(4, 1024, 0, 0).shape()) == pytest.approx(3.0 * prior.predict(GridPoint(4, 1024, 0, 0).shape()), rel=0.05)
    big = GridPoint(0, 32, 512, 0).shape()
    assert not cost.measured(big) and cost.predict(big) == pytest.approx(3.0 * prior.predict(big), rel=0.05)
    c = prior.coefficients

    def dense_s(shape):   # dense steps dequantize first: 40x the shipped constant, 5x the rest
        f = shape.features()
        return 40 * c[0] + 5 * sum(c[i] * f[i] for i in range(1, 7))
    for point in (GridPoint(0, 32, 512, 0), GridPoint(0, 32, 1024, 1024), GridPoint(64, 512, 256, 0),
                  GridPoint(128, 2048, 0, 0)):
        cost.observe(point.shape(), dense_s(point.shape()), on_kernels=False)
    assert cost.measured(big)
    for point in (GridPoint(0, 32, 256, 0), GridPoint(32, 1024, 1024, 3072)):   # the constant told apart
        assert cost.predict(point.shape()) == pytest.approx(dense_s(point.shape()), rel=0.05)
    assert cost.predict(one) == pytest.approx(3.0 * prior.predict(one), rel=0.05)   # the kernels' unchanged
