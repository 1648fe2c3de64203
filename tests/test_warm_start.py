"""The simulator warm start's choice of configurations to try first."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import optuna

from autotuner import warm_start
from autotuner.controller import Controller, ControllerSettings
from autotuner.search_space import load_search_space
from autotuner.simulated_tuning import VLLM_DEFAULTS, compare, tune_on_simulator
from autotuner.static_grid import grid_points
from simulation import workload_run
from simulation.simulator import Simulator
from simulation.workload_run import make_simulator, simulate
from autotuner.targets import SimulatedTarget
from autotuner.tuner_state import TunerState
from autotuner.warm_start import (INCUMBENT_MARGIN, RATE_MARGIN, SimulatorWarmStart, WarmStartJob, best_configurations,
                                  observed_workload, search, seed_points, slo_token_budget,
                                  ties_ranked_under_stress)
from loadgen.workload import generate, load_workload
from simulation.cost_model import CostModel
from policies import Knobs
from engine.scheduling.error_budget import HORIZON_S as ERROR_BUDGET_HORIZON_S
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow


def study_with(results: list[tuple[int, float, float]]) -> optuna.Study:
    """One trial per (token_budget, value, TBT excess over the SLO)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    dists = {"token_budget": optuna.distributions.IntDistribution(32, 2048, step=32)}
    for budget, value, excess in results:
        study.enqueue_trial({"token_budget": budget})
        trial = study.ask(dists)
        trial.set_constraint("tbt", excess)
        study.tell(trial, value)
    return study


def ranked_budgets(results: list[tuple[int, float, float]], stress: dict[int, float] | None,
                   serving_counts: bool = True) -> list[int]:
    """The token budgets ties_ranked_under_stress hands over first, `stress` a made-up table of
    values at the stress rate (None: no stress run)."""
    study, space = study_with(results), load_search_space()
    value = None if stress is None else (lambda params: stress[params["token_budget"]])
    ranked = ties_ranked_under_stress(study, space, best_configurations(study, space, keep=2), value, serving_counts)
    return [c["token_budget"] for c in ranked]


def test_feasible_configurations_come_first_best_value_first():
    study = study_with([(64, 0.5, 0.0), (512, 0.9, 0.3), (128, 0.8, -0.1), (256, 0.7, 0.0)])
    chosen = best_configurations(study, load_search_space(), keep=2)
    assert [c["token_budget"] for c in chosen] == [128, 256]


def test_without_a_feasible_configuration_the_best_values_are_tried():
    study = study_with([(64, 0.1, 0.4), (512, 0.3, 1.5), (128, 0.2, 0.05), (256, 0.6, 0.0)])
    chosen = best_configurations(study, load_search_space(), keep=3)
    assert [c["token_budget"] for c in chosen] == [256, 512, 128]


def test_ties_are_ranked_under_stress_the_knobs_serving_first_unless_it_separates_them():
    """Budgets scored within INCUMBENT_MARGIN of the best that met the SLO are re-ranked by their
    value at the stress rate (here a made-up table); the knobs serving now (the first trial) stay
    first unless the stress run puts another clearly above them, and without a stress run."""
    close = 1.0 - INCUMBENT_MARGIN / 2
    stress = {2048: 0.9, 160: 0.9 + INCUMBENT_MARGIN / 2, 256: 0.95, 32: 0.6}
    # tied there too
    assert ranked_budgets([(2048, close, 0.0), (160, 1.0, 0.0), (256, 0.9, 0.0)], stress) == [2048, 160]
    # stress separates
    assert ranked_budgets([(32, close, 0.0), (2048, 1.0, 0.0), (160, 0.9, 0.0)], stress) == [2048, 32]
    # not tied: by stress
    assert ranked_budgets([(2048, 0.9, 0.0), (160, 1.0, 0.0), (256, close, 0.0)], stress) == [256, 160]
    # missed the SLO
    assert ranked_budgets([(2048, 1.0, 0.2), (160, 0.99, 0.0), (256, 0.9, 0.0)], stress) == [160, 256]
    # nothing tied
    assert ranked_budgets([(2048, 1.0, 0.0), (160, 0.9, 0.0)], stress) == [2048, 160]
    # too few observed requests for a stress run: the knobs serving stay first while tied
    assert ranked_budgets([(32, close, 0.0), (2048, 1.0, 0.0), (160, 0.9, 0.0)], None) == [32, 2048]
    assert ranked_budgets([(2048, 0.9, 0.0), (160, 1.0, 0.0), (256, close, 0.0)], None) == [160, 256]


def test_ties_fall_back_to_the_shipped_defaults_where_the_knobs_serving_are_not_kept():
    """Among the configurations tied at the top, the shipped defaults (a 2048-token cap, every other
    knob at its default) come first when the knobs serving now are not tied, or serve under another
    policy than the tuned one (a sarathi start: its knobs never served deadline steps), rather than
    the one a few observed requests happened to score highest; a stress run that clearly separates
    them still ranks them."""
    close = 1.0 - INCUMBENT_MARGIN / 2
    start_32, defaults, other = (32, 0.5, 0.0), (2048, close, 0.0), (96, 1.0, 0.0)
    assert ranked_budgets([start_32, other, defaults], None) == [2048, 96]
    tied_under_stress = {2048: 0.9, 96: 0.9 + INCUMBENT_MARGIN / 2, 32: 0.5}
    assert ranked_budgets([start_32, other, defaults], tied_under_stress) == [2048, 96]
    assert ranked_budgets([start_32, other, defaults], {2048: 0.8, 96: 0.9, 32: 0.5}) == [96, 2048]
    assert ranked_budgets([start_32, other, (2048, 0.9, 0.0)], None) == [96, 2048]       # the defaults not tied
    tied_start = (32, 1.0, 0.0)
    assert ranked_budgets([tied_start, other, defaults], None) == [32, 96]               # serving under deadline
    assert ranked_budgets([tied_start, other, defaults], None, serving_counts=False) == [2048, 32]


def test_the_engines_policy_reaches_the_search():
    """A start on another policy than the tuned one: the job says so, so its knobs are not kept."""
    finished = [SimpleNamespace(num_prompt_tokens=100, num_output_tokens=20, num_cached_tokens=0)] * 5
    warm = SimulatorWarmStart(lambda: CostModel((0.03, 1e-3, 0.0, 0.0, 0.0, 0.0, 0.0)), load_search_space(),
                              SloClass(), "deadline", Knobs, lambda seconds: finished, trials=1, keep=1,
                              base_policy=lambda: "sarathi")
    assert warm.job(SimpleNamespace(seconds=60.0, arrival_rate_rps=1.0)).serving_policy == "sarathi"


def test_on_too_few_observed_requests_the_search_runs_only_the_candidates_given_a_priori(monkeypatch):
    """Fewer than MIN_STRESS_SAMPLES observed requests: the knobs serving, the shipped defaults and
    the coarse grid are simulated, no TPE sample fitted to those few requests; enough: the trials asked."""
    simulated = []
    score_of = warm_start.simulated_score
    monkeypatch.setattr(warm_start, "simulated_score",
                        lambda job, specs, params: simulated.append(params) or score_of(job, specs, params))
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    knobs = {k: v for k, v in Knobs(token_budget=32).as_dict().items() if k != "version"}
    lengths = [(100 + 7 * i, 20 + i, 0) for i in range(warm_start.MIN_STRESS_SAMPLES)]
    job = WarmStartJob(cost, load_search_space(), SloClass(ttft_s=2.0, tbt_s=0.25), "deadline", knobs,
                       lengths[:5], 0.5, trials=30, keep=3)
    search(job)
    space = job.space
    a_priori = [space.clamp(knobs), warm_start.shipped_defaults(space),
                *(space.clamp(knobs | point) for point in seed_points("deadline", 30))]
    assert [space.snap(p) for p in simulated] == a_priori
    simulated.clear()
    search(replace(job, lengths=lengths))
    assert len(simulated) >= 30          # the trials asked, and the stress run's


def test_cold_start_budget_is_the_largest_chunk_within_the_tbt_slo():
    """Linear cost 10 ms + 1 ms/token: under a 0.2 s bound with 15% headroom (0.17 s) the largest
    32-multiple whose chunk fits is 160 (0.17 s); with no budget fitting, the lowest."""
    cost = CostModel((0.01, 1e-3, 0.0, 0.0, 0.0, 0.0, 0.0))
    space = load_search_space()
    assert slo_token_budget(cost, SloClass(ttft_s=2.0, tbt_s=0.2), space, 0.15) == 160
    assert slo_token_budget(cost, SloClass(ttft_s=2.0, tbt_s=0.01), space, 0.15) == 32
    assert slo_token_budget(cost, SloClass(ttft_s=2.0, tbt_s=100.0), space, 0.15) == 2048


def test_simulated_controller_warm_starts_in_process(tmp_path):
    """tune --simulate: the warm start's best configuration is the regime's first trial."""
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    specs = generate(load_workload("chat"), qps=1.0, duration_s=240, seed=3)
    settings = ControllerSettings.load(policy="adaptive", min_requests=10, min_tbt_samples=200, max_window_s=30.0,
                                       warm_start_trials=4, warm_start_enqueue=2)
    controller, _, _ = tune_on_simulator(specs, cost, str(tmp_path), SloClass(ttft_s=2.0, tbt_s=0.25), settings)
    sources = [t.user_attrs.get("source") for t in controller.study.trials]
    # the second window measures the next pick, or re-measures the first if it served every request
    assert sources[0] == "warm-start" and sources[1] in ("warm-start", "recheck")


def test_warm_start_search_finds_what_a_grid_search_finds(tmp_path):
    """End to end on the simulator: the controller enters its first regime, the warm start searches
    simulations of the requests just observed and enqueues its best configurations; the first of them
    serves that same simulated workload within 10% of the goodput of the best point of the offline
    grid (budgets x prefill priorities). The knobs serving at entry (a 32-token budget) are well
    below that, so the search, not its first candidate, has to find it."""
    slo = SloClass(ttft_s=2.0, tbt_s=0.25)
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    space = load_search_space()
    sim = make_simulator(cost, "adaptive", Knobs(token_budget=32), slo)
    telemetry = TelemetryWindow(slo, clock=lambda: sim.now)
    target = SimulatedTarget(sim, telemetry)
    jobs: list[WarmStartJob] = []
    warm = SimulatorWarmStart(lambda: cost, space, slo, "adaptive", target.knobs,
                              lambda s: telemetry.recent_requests(s, now=sim.now), trials=30, keep=3,
                              runner=lambda job: jobs.append(job) or search(job))
    settings = ControllerSettings.load(policy="adaptive", warm_start_trials=30, warm_start_enqueue=3)
    controller = Controller(target, space, TunerState(tmp_path, seed=0), slo, settings, warm)
    enqueued: list[dict] = []
    controller.listeners.append(lambda d: d["action"] == "warm-start" and enqueued.append(d["knobs"]))
    sim.submit(generate(load_workload("chat"), qps=1.1, duration_s=120, seed=3))
    while controller.study is None:
        assert sim.now < 120, "no regime was entered while traffic lasted"
        controller.step()
    assert len(jobs) == 1 and len(enqueued) == 3
    assert [t.user_attrs["source"] for t in controller.study.trials] == ["warm-start"]   # the first one ran
    assert len(controller.picks) == 2                                                   # the others wait

    job = jobs[0]
    specs = observed_workload(job.lengths, RATE_MARGIN * job.rate_rps, job.seed)     # what the search simulated
    base = Knobs(**job.knobs)

    def goodput(knobs: Knobs) -> float:
        return simulate(specs, cost, "adaptive", knobs, slo).summary.goodput_rps

    grid_best = max(goodput(base.replace(**point)) for point in grid_points("adaptive"))
    assert goodput(base) < 0.85 * grid_best
    assert goodput(Knobs(**enqueued[0])) >= 0.9 * grid_best     # the search's best, which the controller tries first


def test_the_warm_start_simulates_the_prefix_cache_hits_it_observed():
    """Requests that found most of their prompt cached are simulated with a shared prefix of that
    length: the simulated prefix cache then serves about the share of prompt tokens the live one did,
    so a workload of cached prompts is not priced as if every prompt were computed anew."""
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    observed = [(600, 40, 512), (540, 30, 512), (620, 50, 512), (80, 20, 0)]     # a 512-token system prompt
    specs = observed_workload(observed, rate_rps=0.2, num_requests=60)
    assert {s.prefix_tokens for s in specs} <= {512, 0} and any(s.prefix_group for s in specs)
    cached = simulate(specs, cost, "deadline", Knobs(), SloClass(ttft_s=2.0, tbt_s=0.25))
    uncached = simulate(observed_workload([(p, o) for p, o, _ in observed], 0.2, num_requests=60), cost, "deadline",
                        Knobs(), SloClass(ttft_s=2.0, tbt_s=0.25))
    hits = sum(r.num_cached_tokens for r in cached.records) / sum(r.num_prompt_tokens for r in cached.records)
    assert 0.5 < hits < 0.9 and sum(r.num_cached_tokens for r in uncached.records) == 0
    assert cached.summary.ttft_p50_s < 0.5 * uncached.summary.ttft_p50_s


def test_the_search_starts_from_the_policys_grid():
    """A few dozen TPE trials in six dimensions are mostly random: the deadline policy's whole grid
    (12 points) is simulated first, a larger grid thinned evenly to half of the trials."""
    assert seed_points("deadline", 30) == grid_points("deadline")
    plain = seed_points("adaptive", 30)
    assert len(plain) <= 15
    budgets = {p["token_budget"] for p in plain}
    assert min(budgets) == 32 and max(budgets) == 2048


def test_simulated_tuning_spends_the_error_budget_over_the_controllers_context_window(tmp_path, monkeypatch):
    """As in the daemon (tests/test_daemon.py), `tune --simulate`'s simulators, the tuned run's, its
    warm start's searches and the static runs it is compared with, spend the error budget over the
    controller's context_window_s (45 s here), not the engine's default horizon."""
    built: list[Simulator] = []

    class Recorded(Simulator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    searched: list[tuple] = []
    real_simulate = warm_start.simulate
    monkeypatch.setattr(workload_run, "Simulator", Recorded)
    monkeypatch.setattr(warm_start, "simulate", lambda *a, **k: searched.append(a) or real_simulate(*a, **k))
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    specs = generate(load_workload("chat"), qps=1.0, duration_s=120, seed=3)
    settings = ControllerSettings.load(policy="adaptive", context_window_s=45.0, min_requests=10,
                                       min_tbt_samples=200, max_window_s=30.0, warm_start_trials=2,
                                       warm_start_enqueue=1)
    assert ERROR_BUDGET_HORIZON_S != settings.context_window_s
    compare(specs, cost, str(tmp_path), SloClass(ttft_s=2.0, tbt_s=0.25), settings, ablation=False)
    assert searched, "the warm start never searched"
    assert len(built) > len(searched) + len(VLLM_DEFAULTS)
    assert {sim.scheduler.error_budget.horizon_s for sim in built} == {45.0}


def test_the_search_ranks_ties_under_stress_only_on_enough_observed_requests(monkeypatch):
    """Fewer than MIN_STRESS_SAMPLES observed requests: no stress run (None); enough: a callable that
    simulates a configuration at the stress rate."""
    seen = []
    monkeypatch.setattr(warm_start, "ties_ranked_under_stress",
                        lambda study, space, best, value, serving_counts: seen.append(value) or best)
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    knobs = {k: v for k, v in Knobs().as_dict().items() if k != "version"}
    lengths = [(100 + 7 * i, 20 + i, 0) for i in range(warm_start.MIN_STRESS_SAMPLES)]
    job = WarmStartJob(cost, load_search_space(), SloClass(ttft_s=2.0, tbt_s=0.25), "deadline", knobs,
                       lengths[:-1], 0.5, trials=2, keep=2)
    search(job)
    search(replace(job, lengths=lengths))
    assert seen[0] is None and callable(seen[1])
    assert seen[1]({"token_budget": 256}) > 1.0     # at 1 request/s all within the SLO, TTFT to spare
