"""The simulator runs the real scheduler and policies on a virtual clock; the cost model fits steps."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from serving.cli import main
from simulation.cost_model_files import SHIPPED_COST_MODEL, find_cost_model
from simulation.workload_run import simulate
from loadgen.workload import RequestSpec, generate, load_workload
from simulation.cost_model import FEATURES, CostModel, StepShape, fit_cost_model
from simulation.simulator import Simulator
from policies import POLICIES, Knobs


def constant_cost(seconds: float) -> CostModel:
    return CostModel((seconds,) + (0.0,) * (len(FEATURES) - 1), kv_blocks=64, block_size=4)


def run(sim: Simulator, specs: list[RequestSpec]):
    records, steps = [], []
    sim.finish_listeners.append(records.append)
    sim.step_listeners.append(steps.append)
    sim.submit(specs)
    sim.run()
    return sorted(records, key=lambda r: r.request_id), steps


def test_hand_computed_timeline():
    """0.1 s per step. A (4-token prompt, 3 outputs) at 0; B (2, 2) at 0.15.
    t=0: prefill A -> A1 at 0.1; t=0.1: decode A -> A2 at 0.2 (B not there yet);
    t=0.2: decode A + prefill B -> A3 (A done), B1 at 0.3; t=0.3: decode B -> B2 at 0.4 (done)."""
    sim = Simulator(constant_cost(0.1), 64, 4, "sarathi", Knobs(token_budget=8))
    (a, b), steps = run(sim, [RequestSpec(0.0, 4, 3, "x"), RequestSpec(0.15, 2, 2, "x")])
    assert a.token_times == pytest.approx((0.1, 0.2, 0.3)) and a.finished == pytest.approx(0.3)
    assert b.arrival == 0.15 and b.token_times == pytest.approx((0.3, 0.4)) and b.ttft_s == pytest.approx(0.15)
    assert [(s.num_prefill_tokens, s.num_decode_tokens) for s in steps] == [(4, 0), (0, 1), (2, 1), (0, 1)]
    assert [s.start for s in steps] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert sim.blocks.num_free_blocks == 64


def test_step_time_follows_the_cost_model():
    coefficients = (0.01, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0)   # 10 ms + 1 ms per token
    sim = Simulator(CostModel(coefficients, kv_blocks=64, block_size=4), 64, 4, "sarathi", Knobs(token_budget=16))
    (r,), steps = run(sim, [RequestSpec(0.0, 10, 2, "x")])
    assert [s.duration_s for s in steps] == pytest.approx([0.020, 0.011])
    assert r.token_times == pytest.approx((0.020, 0.031))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_coasting_through_decodes_changes_nothing(policy):
    """Replaying all-decode stretches without the policy (finishes included) gives the very same run,
    preemptions, step records and the error budget included."""
    specs = generate(load_workload("chat"), qps=3.0, num_requests=120, seed=1)
    cost = find_cost_model(str(SHIPPED_COST_MODEL))
    results = []
    for coast in (False, True):
        sim = Simulator(cost, 200, 16, policy, Knobs(token_budget=256), coast=coast)
        records, steps = run(sim, specs)
        results.append((records, steps, sim.scheduler.error_budget.state(sim.now), sim.num_steps))
    assert results[0] == results[1]
    assert len(results[0][0]) == len(specs)


def test_without_shared_prefixes_the_prefix_cache_changes_nothing_but_its_counters():
    """simulate() runs such workloads on the plain block manager (workload_run.shares_prefixes)."""
    specs = generate(load_workload("chat"), qps=3.0, num_requests=120, seed=1)
    cost = find_cost_model(str(SHIPPED_COST_MODEL))
    runs = []
    for caching in (True, False):
        records, steps = run(Simulator(cost, 120, 16, "deadline", Knobs(token_budget=256),
                                       prefix_caching=caching), specs)
        runs.append((records, [replace(s, prefix_cache_queries=0) for s in steps]))
    assert runs[0] == runs[1]
    assert any(r.num_preemptions for r in runs[0][0])     # a full pool: preemption frees the same blocks


def test_knob_change_mid_run_keeps_every_request():
    specs = generate(load_workload("chat"), qps=2.0, num_requests=80, seed=2)
    sim = Simulator(find_cost_model(str(SHIPPED_COST_MODEL)), 300, 16, "sarathi", Knobs(token_budget=64))
    records = []
    sim.finish_listeners.append(records.append)
    sim.submit(specs)
    sim.run_until(10.0)
    sim.scheduler.set_policy("adaptive")
    sim.scheduler.set_knobs(sim.scheduler.knobs.replace(token_budget=1024, prefill_priority=1.0))
    assert sim.scheduler.policy.name == "sarathi" and sim.scheduler.latest_policy == "adaptive"   # at the next step
    sim.run()
    assert sim.scheduler.policy.name == sim.scheduler.latest_policy == "adaptive"
    assert len(records) == len(specs) and all(r.finish_reason == "length" for r in records)
    assert sim.blocks.num_free_blocks == 300


def test_too_big_request_is_rejected_not_stuck():
    sim = Simulator(constant_cost(0.1), 4, 4, "sarathi", Knobs(token_budget=8))
    records, _ = run(sim, [RequestSpec(0.0, 30, 5, "x"), RequestSpec(0.0, 4, 2, "x")])
    assert sim.num_rejected == 1 and len(records) == 1


def test_fit_recovers_known_coefficients():
    truth = CostModel((0.02, 1e-4, 2e-4, 3e-5, 1e-7, 1e-9, 1e-5))
    shapes = [StepShape(p, d, d + (p > 0), d * 300 + p + c, d * 300 + p * c + p * p // 2, d + (p > 0))
              for p in (0, 16, 128, 512) for d in (0, 1, 8, 32) for c in (0, 700) if p or d]
    model = fit_cost_model(shapes, [truth.predict(s) for s in shapes], model="m", dtype="fp32", device="cpu")
    assert model.fit_mape < 1e-3


def test_a_quantized_engines_two_paths_are_fitted_and_priced_apart(tmp_path):
    """Steps of up to kernel_max_rows tokens run on the quantized kernels (cheap constant, steep rows),
    larger ones on dequantize + fp32 GEMM: one line fits neither, a set per path fits both."""
    kernels = CostModel((0.025, 3e-3, 0.0, 0.0, 1e-7, 0.0, 1e-5))
    dense = CostModel((0.06, 2e-4, 0.0, 3e-5, 1e-7, 1e-9, 1e-5))
    shapes = [StepShape(p, d, d + (p > 0), d * 300 + p + c, d * 300 + p * c + p * p // 2, d + (p > 0))
              for p in (0, 1, 8, 128, 512) for d in (0, 1, 2, 4, 8, 16, 32) for c in (0, 700) if p or d]
    truth = [(kernels if s.num_prefill_tokens + s.num_decode_tokens <= 16 else dense).predict(s) for s in shapes]
    one_line = fit_cost_model(shapes, truth, model="m", dtype="fp32", device="cpu")
    two_paths = fit_cost_model(shapes, truth, model="m", dtype="fp32", device="cpu", weights="quantized",
                               kernel_max_rows=16)
    assert one_line.fit_mape > 0.05 and two_paths.fit_mape < 1e-3
    decode = StepShape(0, 1, 1, 300, 300, 1)
    assert two_paths.predict(decode) == pytest.approx(kernels.predict(decode), rel=1e-3)
    assert two_paths.scaled(2.0).predict(decode) == pytest.approx(2 * kernels.predict(decode), rel=1e-3)
    assert CostModel.load(two_paths.save(tmp_path / "q.json")) == two_paths
    assert two_paths.describes("m", "fp32", "cpu", "", "quantized") and not two_paths.describes("m", "fp32", "cpu", "")
    few = fit_cost_model(shapes, truth, weights="quantized", kernel_max_rows=1)     # too few kernel steps to fit
    assert few.kernel_max_rows == 1 and few.kernel_coefficients == few.coefficients


def test_cost_model_round_trip_and_bad_file(tmp_path):
    model = CostModel((0.1,) * len(FEATURES), model="m", dtype="fp32", device="cpu", kv_blocks=10)
    assert CostModel.load(model.save(tmp_path / "m.json")) == model
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read cost model"):
        CostModel.load(tmp_path / "bad.json")


def test_shipped_cost_model_is_plausible():
    """Calibrated on this kind of machine: a decode step and a 512-token chunk in sane ranges."""
    cost = find_cost_model(str(SHIPPED_COST_MODEL))
    decode32 = cost.predict(StepShape(0, 32, 32, 32 * 300, 32 * 300, 32))
    chunk512 = cost.predict(StepShape(512, 0, 1, 512, 512 * 513 // 2, 1))
    assert 0.005 < decode32 < 1.0 and decode32 < chunk512 < 10.0


def test_holdout_error_is_the_error_on_the_steps_kept_out_of_the_fit():
    """Steps of a known model with 10-30% errors, a quarter held out. Which steps were held out is
    found, not assumed: those whose time can change without changing the fitted coefficients. The
    reported held-out MAPE is the returned model's mean relative error on exactly those, the fit
    MAPE on the rest."""
    truth = CostModel((0.02, 1e-4, 2e-4, 3e-5, 1e-7, 1e-9, 1e-5))
    shapes = [StepShape(p, d, d + (p > 0), d * 300 + p + c, d * 300 + p * c + p * p // 2, d + (p > 0))
              for p in (0, 16, 128, 512) for d in (0, 1, 8, 32) for c in (0, 700) if p or d]
    noise = [0.1 + 0.2 * ((7 * i) % 11) / 10 for i in range(len(shapes))]
    seconds = [truth.predict(sh) * (1 + n if i % 2 else 1 - n) for i, (sh, n) in enumerate(zip(shapes, noise))]
    model = fit_cost_model(shapes, seconds, holdout_fraction=0.25, seed=3)
    held = [i for i in range(len(shapes))
            if fit_cost_model(shapes, seconds[:i] + [3 * seconds[i]] + seconds[i + 1:], 0.25, 3).coefficients
            == model.coefficients]
    used = [i for i in range(len(shapes)) if i not in held]
    assert len(held) == len(shapes) // 4 and model.num_samples == len(used)
    error = [abs(model.predict(sh) - t) / t for sh, t in zip(shapes, seconds)]
    assert model.holdout_mape == pytest.approx(sum(error[i] for i in held) / len(held))
    assert model.fit_mape == pytest.approx(sum(error[i] for i in used) / len(used))
    assert fit_cost_model(shapes, seconds, holdout_fraction=0.0).holdout_mape is None


def test_simulate_command_reports_the_run_it_was_asked_for(tmp_path, capsys):
    """A workload file (a 4-token prompt and 3 output tokens every 2 s) on a cost model file of 0.1 s
    a step: alone in the engine, each request gets its first token after one step, the others 0.1 s
    apart, and is done 0.3 s after it arrived. A 2-token budget splits each prompt over two steps
    (TTFT 0.2 s, done after 0.4 s); a 0.05-s TBT SLO is missed by every request."""
    workload = tmp_path / "every2s.yaml"
    workload.write_text("phases:\n  - name: x\n    arrival: fixed\n    lengths: {kind: fixed, prompt: 4, output: 3}\n")
    cost = constant_cost(0.1).save(tmp_path / "cost.json")
    arrivals = [s.arrival_s for s in generate(load_workload(str(workload)), qps=0.5, num_requests=5)]
    assert arrivals == pytest.approx([arrivals[0] + 2 * i for i in range(5)])

    def simulate_command(*extra: str) -> dict:
        assert main(["simulate", "--workload", str(workload), "--qps", "0.5", "--requests", "5",
                     "--cost-model", str(cost), *extra]) == 0
        return json.loads(capsys.readouterr().out)

    out = simulate_command()
    duration = arrivals[-1] + 0.3 - arrivals[0]
    assert (out["num_finished"], out["num_steps"], out["slo_attainment"]) == (5, 15, 1.0)
    assert (out["ttft_p50_s"], out["tbt_p99_s"], out["e2e_p99_s"]) == pytest.approx((0.1, 0.1, 0.3))
    assert out["duration_s"] == pytest.approx(duration)
    assert (out["goodput_rps"], out["output_tokens_per_s"]) == pytest.approx((5 / duration, 15 / duration))
    out = simulate_command("--knob", "token_budget=2")
    assert out["knobs"]["token_budget"] == 2 and out["num_steps"] == 20
    assert (out["ttft_p50_s"], out["tbt_p99_s"], out["e2e_p99_s"]) == pytest.approx((0.2, 0.1, 0.4))
    assert out["goodput_rps"] == pytest.approx(5 / (arrivals[-1] + 0.4 - arrivals[0]))
    out = simulate_command("--slo-tbt-s", "0.05")
    assert (out["goodput_rps"], out["slo_attainment"], out["slo_tbt_s"]) == (0.0, 0.0, 0.05)


def test_simulate_command_rejects_bad_knob(capsys):
    assert main(["simulate", "--knob", "token_budget=-3"]) == 2
    assert "token_budget" in capsys.readouterr().err


def test_simulation_summary_counts_rejections():
    cost = CostModel((0.05,) + (0.0,) * (len(FEATURES) - 1), kv_blocks=2, block_size=4)
    run_ = simulate([RequestSpec(0.0, 4, 2, "x"), RequestSpec(0.1, 40, 2, "x")], cost)
    assert run_.summary.num_requests == 2 and run_.summary.num_failed == 1


def test_an_unreadable_state_dir_calibration_falls_back_to_the_shipped_one(tmp_path):
    """An upgraded daemon whose state dir holds a calibration with another feature set still starts."""
    (tmp_path / "cost_models").mkdir()
    (tmp_path / "cost_models" / "old.json").write_text(json.dumps({"features": ["constant"], "coefficients": [1.0]}))
    assert find_cost_model(None, str(tmp_path)) == find_cost_model(str(SHIPPED_COST_MODEL))
    with pytest.raises(ValueError, match="other features"):
        find_cost_model(str(tmp_path / "cost_models" / "old.json"))


def test_online_cost_model_follows_the_machine_speed_without_extrapolating():
    """Live steps all at one small budget running 1.5x slower than calibrated: the daemon's model
    becomes 1.5x slower at every size, including sizes the live steps never had."""
    from simulation.live_cost_model import MIN_LIVE_STEPS, LiveCostModel
    from engine.outputs import StepRecord

    base = CostModel.load(SHIPPED_COST_MODEL)
    online = LiveCostModel(base)
    assert online.current() is base                       # too few steps yet
    for i in range(MIN_LIVE_STEPS):
        shape = StepShape(32, 4, 5, 2000, 3000, 5)
        online.on_step(StepRecord(i, float(i), 1.5 * base.predict(shape), 32, 4, 1, 5, 0, 0, 0.1, 2000, 3000, 5,
                                  0.0, 0.0, 0.0, 0.0, "sarathi", 0))
    big = StepShape(1888, 0, 1, 1888, 1888 * 1889 // 2, 1)
    assert online.current().predict(big) == pytest.approx(1.5 * base.predict(big))


def test_live_cost_model_keeps_the_schedulers_copy_to_the_live_speed():
    """The engine's scheduler (the deadline policy's pricing) follows the live speed, with or without the tuner."""
    from types import SimpleNamespace

    from simulation.live_cost_model import MIN_LIVE_STEPS, REFRESH_EVERY_STEPS, SIZED_PRIOR, LiveCostModel
    from engine.outputs import StepRecord

    base = CostModel.load(SHIPPED_COST_MODEL)
    engine = SimpleNamespace(scheduler=SimpleNamespace(cost=None), step_listeners=[],
                             block_manager=SimpleNamespace(num_blocks=base.kv_blocks * 3, block_size=32),
                             model_config=SimpleNamespace(window=None))
    live = LiveCostModel(base).attach(engine)
    assert engine.scheduler.cost.coefficients == pytest.approx([c * SIZED_PRIOR for c in base.coefficients])
    assert (live.current().kv_blocks, live.current().block_size) == (base.kv_blocks * 3, 32)   # the engine's pool
    shape = StepShape(32, 4, 5, 2000, 3000, 5)
    for i in range(max(MIN_LIVE_STEPS, REFRESH_EVERY_STEPS) + 1):
        for listener in engine.step_listeners:
            listener(StepRecord(i, float(i), 0.5 * base.predict(shape), 32, 4, 1, 5, 0, 0, 0.1, 2000, 3000, 5,
                                0.0, 0.0, 0.0, 0.0, "deadline", 0))
    assert engine.scheduler.cost.predict(shape) == pytest.approx(0.5 * base.predict(shape))


def test_each_weights_path_follows_its_own_live_speed():
    """A quantized engine: steps on the kernels at 0.9x their prediction, larger dense steps at 1.3x.
    Each path's prices follow its own steps; one median over all (mostly kernel steps) would leave
    the dense steps, which the deadline policy sizes prefill chunks with, 40% under-priced."""
    from simulation.live_cost_model import MIN_LIVE_STEPS, LiveCostModel
    from engine.outputs import StepRecord

    base = CostModel.load(SHIPPED_COST_MODEL.parent / "smollm2-135m-instruct-fp32-quantized-cpu.json")
    assert base.kernel_max_rows >= 4
    online = LiveCostModel(base)
    # a decode on the kernels; a mixed step just past the calibrated crossover, on the dense path
    decode, mixed = StepShape(0, 4, 4, 800, 800, 4), StepShape(base.kernel_max_rows, 4, 4, 900, 2600, 5)
    for i in range(MIN_LIVE_STEPS):
        shape, factor = (mixed, 1.3) if i % 4 == 0 else (decode, 0.9)
        online.on_step(StepRecord(i, float(i), factor * base.predict(shape), shape.num_prefill_tokens,
                                  shape.num_decode_tokens, 1, 5, 0, 0, 0.1, shape.context_tokens,
                                  shape.attended_pairs, shape.num_sampled, 0.0, 0.0, 0.0, 0.0, "deadline", 0))
    now = online.current()
    assert now.predict(decode) == pytest.approx(0.9 * base.predict(decode))
    assert now.predict(mixed) == pytest.approx(1.3 * base.predict(mixed))
    assert online.describe()["dense_speed_factor"] == pytest.approx(1.3)


def test_the_scheduler_prices_deadlines_at_the_upper_tail_of_live_step_times():
    """Live steps scattered 0.8x-1.6x around the model: the tuner's copy takes the median (and carries
    the scatter about it only when asked: the warm start simulates without it), the scheduler's (which
    sizes each step to a slack) the 90th percentile, so few steps overrun it."""
    from types import SimpleNamespace

    import numpy as np

    from simulation.live_cost_model import DEADLINE_QUANTILE, MIN_LIVE_STEPS, REFRESH_EVERY_STEPS, LiveCostModel
    from simulation.step_scatter import factor_at
    from engine.outputs import StepRecord

    base = CostModel.load(SHIPPED_COST_MODEL)
    engine = SimpleNamespace(scheduler=SimpleNamespace(cost=None), step_listeners=[],
                             block_manager=SimpleNamespace(num_blocks=base.kv_blocks, block_size=base.block_size),
                             model_config=SimpleNamespace(window=None))
    live = LiveCostModel(base).attach(engine)
    shape = StepShape(32, 4, 5, 2000, 3000, 5)
    factors = np.linspace(0.8, 1.6, max(MIN_LIVE_STEPS, REFRESH_EVERY_STEPS))
    for i, factor in enumerate(np.random.default_rng(0).permutation(factors)):
        for listener in engine.step_listeners:
            listener(StepRecord(i, float(i), factor * base.predict(shape), 32, 4, 1, 5, 0, 0, 0.1, 2000, 3000, 5,
                                0.0, 0.0, 0.0, 0.0, "deadline", 0))
    assert live.current().predict(shape) == pytest.approx(np.median(factors) * base.predict(shape))
    assert engine.scheduler.cost.predict(shape) == pytest.approx(
        np.quantile(factors, DEADLINE_QUANTILE) * base.predict(shape))
    assert live.current().step_scatter == ()
    scatter = live.current(scatter=True).step_scatter
    assert factor_at(scatter, 0.5) == pytest.approx(1.0)
    assert factor_at(scatter, DEADLINE_QUANTILE) == pytest.approx(np.quantile(factors, DEADLINE_QUANTILE) / np.median(factors))
    assert factor_at(scatter, 0.01) == pytest.approx(np.quantile(factors, 0.01) / np.median(factors))


def test_the_scheduler_prices_the_steps_it_sizes_by_their_own_ratios_from_the_first_ones():
    """Decode-only steps run at 0.6x the model, prefill-carrying ones (the steps sized to a TBT slack) at
    1.0x-1.4x: the scheduler's copy starts SIZED_PRIOR slower than the calibration, takes DEADLINE_QUANTILE
    of the prefill steps alone after the first few dozen of them (not MIN_LIVE_STEPS); the tuner's copy
    is the calibration until then."""
    from types import SimpleNamespace

    import numpy as np

    from simulation.live_cost_model import (DEADLINE_QUANTILE, EARLY_REFRESH_STEPS, MIN_LIVE_STEPS, MIN_PATH_STEPS,
                                            SIZED_PRIOR, LiveCostModel)
    from engine.outputs import StepRecord

    base = CostModel.load(SHIPPED_COST_MODEL)
    engine = SimpleNamespace(scheduler=SimpleNamespace(cost=None), step_listeners=[],
                             block_manager=SimpleNamespace(num_blocks=base.kv_blocks, block_size=base.block_size),
                             model_config=SimpleNamespace(window=None))
    live = LiveCostModel(base).attach(engine)
    prefill, decode = StepShape(32, 4, 5, 2000, 3000, 5), StepShape(0, 8, 8, 4000, 4000, 8)
    assert engine.scheduler.cost.predict(prefill) == pytest.approx(SIZED_PRIOR * base.predict(prefill))
    steps = 2 * MIN_PATH_STEPS + EARLY_REFRESH_STEPS - (2 * MIN_PATH_STEPS) % EARLY_REFRESH_STEPS
    assert steps < MIN_LIVE_STEPS
    factors = np.random.default_rng(0).permutation(np.linspace(1.0, 1.4, steps // 2))
    for i in range(steps):
        shape, factor = (prefill, factors[i // 2]) if i % 2 else (decode, 0.6)
        record = StepRecord(i, float(i), factor * base.predict(shape), shape.num_prefill_tokens,
                            shape.num_decode_tokens, 1 if shape.num_prefill_tokens else 0, 8, 0, 0, 0.1,
                            shape.context_tokens, shape.attended_pairs, shape.num_sampled, 0.0, 0.0, 0.0, 0.0,
                            "deadline", 0)
        for listener in engine.step_listeners:
            listener(record)
    assert engine.scheduler.cost.predict(prefill) == pytest.approx(
        np.quantile(factors, DEADLINE_QUANTILE) * base.predict(prefill))
    assert live.current().predict(prefill) == pytest.approx(base.predict(prefill))


def test_simulate_command_runs_a_duration(capsys):
    """--duration: every arrival in that many simulated seconds (the phases split them by share)."""
    assert main(["simulate", "--profile", "h100-llama3.1-8b", "--workload", "shift-gpu", "--qps", "0.5",
                 "--duration", "60", "--policy", "deadline"]) == 0
    out = json.loads(capsys.readouterr().out)
    specs = generate(load_workload("shift-gpu"), qps=0.5, duration_s=60.0)
    assert out["num_requests"] == len(specs) > 0
    assert main(["simulate", "--duration", "0"]) == 2
