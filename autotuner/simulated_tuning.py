"""`autotuned-serve tune --simulate`: the controller against the simulator on a (shifting) workload,
next to the best single static configuration found offline and vLLM-like defaults, on the same
requests. What-if analysis for ops teams, and the controller's fast test bed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from optuna.trial import TrialState

from autotuner.controller import SLO_HEADROOM, Controller, ControllerSettings, chosen_configuration
from autotuner.search_space import DEFAULT_KNOBS, SHIPPED_KNOBS, SearchSpace, load_search_space
from autotuner.static_grid import grid_points, speculation_points
from simulation.workload_run import make_simulator, shares_prefixes, simulate
from autotuner.targets import SimulatedTarget
from autotuner.tuner_state import TunerState
from autotuner.warm_start import SimulatorWarmStart, slo_token_budget
from loadgen.workload import RequestSpec
from simulation.cost_model import CostModel
from simulation.speculation_model import SpeculationModel
from engine.outputs import RequestRecord
from engine.scheduling.error_budget import HORIZON_S as ERROR_BUDGET_HORIZON_S
from policies import Knobs
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow, meets_slo

# vLLM V1's scheduler: chunked prefill with running decodes first (= sarathi), FCFS, a step budget
# of max_num_batched_tokens (2048 by default on most GPUs, 8192 on large ones), 256 sequences.
VLLM_DEFAULTS = {"vllm_default_2048": ("sarathi", Knobs(token_budget=2048, max_num_seqs=256)),
                 "vllm_default_8192": ("sarathi", Knobs(token_budget=8192, max_num_seqs=256))}
PLAIN_POLICY = "adaptive"      # token budget and priority only: the inner loop off, for the ablation
# A run is judged in fixed 30-s bins by finish time (bin_verdicts), not in the controller's tuning
# windows, whose length moves with the rate: bins line up across runs of different configurations.
BIN_S = 30.0


@dataclass(frozen=True)
class RunResult:
    goodput_rps: float
    slo_attainment: float | None
    violating_bin_fraction: float      # share of 30-s bins violating the SLO
    duration_s: float
    good_by_phase: dict[str, int]      # requests that met the SLO, per workload phase


def evaluate_static(specs: list[RequestSpec], cost: CostModel, policy: str, knobs: Knobs, slo: SloClass,
                    error_budget_horizon_s: float = ERROR_BUDGET_HORIZON_S,
                    speculation: SpeculationModel | None = None) -> RunResult:
    run = simulate(specs, cost, policy, knobs, slo, error_budget_horizon_s, speculation)
    return RunResult(run.summary.goodput_rps, run.summary.slo_attainment, violating_bin_fraction(run.records, slo),
                     run.summary.duration_s, good_by_phase(specs, run.records, slo))


def good_by_phase(specs: list[RequestSpec], records: list[RequestRecord], slo: SloClass) -> dict[str, int]:
    """Requests that met the SLO, per workload phase (the simulator's ids: sim-<index in arrival order>)."""
    phases = [s.phase for s in sorted(specs, key=lambda s: s.arrival_s)]
    return dict(Counter(phases[int(r.request_id.removeprefix("sim-"))] for r in records if meets_slo(r, slo)))


def per_phase_best_knobs(grid: list[tuple[dict[str, Any], RunResult]]) -> dict[str, dict[str, Any]]:
    """Per phase, the grid configuration that served most of its requests within the SLO."""
    phases = {phase for _, result in grid for phase in result.good_by_phase}
    return {phase: max(grid, key=lambda entry: entry[1].good_by_phase.get(phase, 0))[0] for phase in sorted(phases)}


def static_grid(specs: list[RequestSpec], cost: CostModel, space: SearchSpace, policy: str, slo: SloClass,
                error_budget_horizon_s: float = ERROR_BUDGET_HORIZON_S,
                speculation: SpeculationModel | None = None) -> list[tuple[dict[str, Any], RunResult]]:
    """Every configuration of the policy's offline grid over the daemon's shipped knobs, each run over the
    whole workload; with a drafter (`speculation`), then each other speculation setting
    (static_grid.speculation_points) on the best of those: the grid's points crossed with them would
    be six times the runs."""
    def run(params: dict[str, Any]) -> RunResult:
        return evaluate_static(specs, cost, policy, SHIPPED_KNOBS.replace(**params), slo, error_budget_horizon_s,
                               speculation)

    grid = [(params, run(params)) for params in grid_params(space, policy)]
    if speculation is None:
        return grid
    best_params, _ = best_of(grid)
    best = DEFAULT_KNOBS | best_params
    return grid + [(best_params | point, run(best_params | point)) for point in speculation_points()
                   if best | point != best]        # the shipped setting ran in the grid


def grid_params(space: SearchSpace, policy: str) -> list[dict[str, Any]]:
    """The policy's grid points over the daemon's knobs, the space's knobs on its grid."""
    return [point | space.clamp(DEFAULT_KNOBS | point) for point in grid_points(policy)]


def best_static(specs: list[RequestSpec], cost: CostModel, space: SearchSpace, policy: str, slo: SloClass,
                error_budget_horizon_s: float = ERROR_BUDGET_HORIZON_S,
                speculation: SpeculationModel | None = None) -> tuple[dict[str, Any], RunResult]:
    """Offline grid search on the whole workload: the best single configuration in hindsight."""
    return best_of(static_grid(specs, cost, space, policy, slo, error_budget_horizon_s, speculation))


def best_of(grid: list[tuple[dict[str, Any], RunResult]]) -> tuple[dict[str, Any], RunResult]:
    return max(grid, key=lambda entry: entry[1].goodput_rps)


def per_phase_best_goodput(grid: list[RunResult], duration_s: float) -> float:
    """Goodput if every phase had run the grid configuration best for it, in hindsight (each
    phase's good requests taken from the whole-workload runs, so carry-over between phases is the
    static runs'): about the most that switching configurations between phases can gain."""
    phases = {phase for result in grid for phase in result.good_by_phase}
    return sum(max(r.good_by_phase.get(phase, 0) for r in grid) for phase in phases) / duration_s


def violating_bin_fraction(records: list[RequestRecord], slo: SloClass, bin_s: float = BIN_S,
                           start_s: float = 0.0) -> float:
    """Share of fixed bins (by finish time, from `start_s`) whose P50 TTFT or P99 TBT missed the SLO."""
    verdicts = bin_verdicts(records, slo, bin_s, start_s)
    return verdicts.count(False) / len(verdicts) if verdicts else 0.0


def bin_verdicts(records: list[RequestRecord], slo: SloClass, bin_s: float = BIN_S,
                 start_s: float = 0.0) -> list[bool]:
    """Per fixed bin by finish time from `start_s` to the last finish: whether its P50 TTFT and
    P99 TBT met the SLO (a bin where nothing finished met it)."""
    bins: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.finished >= start_s:
            bins.setdefault(int((r.finished - start_s) // bin_s), []).append(r)
    verdicts = []
    for i in range(max(bins) + 1 if bins else 0):
        ttft = [r.ttft_s for r in bins.get(i, []) if r.ttft_s is not None]
        gaps = [g for r in bins.get(i, []) for g in r.tbt_s]
        verdicts.append(not ((ttft and np.percentile(ttft, 50) > slo.ttft_s) or
                             (gaps and np.percentile(gaps, 99) > slo.tbt_s)))
    return verdicts


def tune_on_simulator(specs: list[RequestSpec], cost: CostModel, state_dir: str, slo: SloClass,
                      settings: ControllerSettings, space: SearchSpace | None = None, seed: int = 0,
                      initial: Knobs | None = None, initial_policy: str | None = None,
                      speculation: SpeculationModel | None = None
                      ) -> tuple[Controller, list[RequestRecord], float]:
    """Serve `specs` on the simulator with the controller retuning it window after window, starting
    from `initial_policy` (default: the tuned policy) with `initial` knobs (default: Knobs()). The
    error budget, the simulated engine's and the warm start's, spends over the controller's context
    window, as in the daemon; `speculation`: how the workload's drafts fare, for the simulated engine
    and the warm start's runs alike (None: no drafter)."""
    space = space or load_search_space()
    horizon = settings.context_window_s
    sim = make_simulator(cost, initial_policy or settings.policy, initial or Knobs(), slo,
                         prefix_caching=shares_prefixes(specs), error_budget_horizon_s=horizon,
                         speculation=speculation)
    telemetry = TelemetryWindow(slo, clock=lambda: sim.now)
    target = SimulatedTarget(sim, telemetry)
    records: list[RequestRecord] = []
    sim.finish_listeners.append(records.append)
    warm = SimulatorWarmStart(lambda: cost, space, slo, settings.policy, target.knobs,
                              lambda s: telemetry.recent_requests(s, now=sim.now), settings.warm_start_trials,
                              settings.warm_start_enqueue, seed, error_budget_horizon_s=horizon,
                              base_policy=target.policy, speculation=speculation)
    controller = Controller(target, space, TunerState(state_dir, seed), slo, settings, warm)
    controller.cold_start(slo_token_budget(cost, slo, space, SLO_HEADROOM))
    sim.submit(specs)
    last_arrival = specs[-1].arrival_s
    while sim.now < last_arrival:
        controller.step()
    sim.run()
    return controller, records, sim.now


def compare(specs: list[RequestSpec], cost: CostModel, state_dir: str, slo: SloClass,
            settings: ControllerSettings, seed: int = 0, ablation: bool = True,
            speculation: SpeculationModel | None = None) -> dict[str, Any]:
    """The JSON summary of `tune --simulate`. `ablation`: also the plain-budget grid (the tuned
    policy's inner loop off), 21 more runs of the whole workload. Every run's error budget spends
    over the controller's context window, the tuned run's horizon; `speculation`: the workload's
    drafts, for the tuned run and the tuned policy's grid (the baselines and the plain-budget grid
    do not draft)."""
    space = load_search_space(max_token_budget=None)
    controller, records, end = tune_on_simulator(specs, cost, state_dir, slo, settings, space, seed,
                                                 speculation=speculation)
    duration = end - specs[0].arrival_s
    tuned = summarize_requests(records, slo, duration)
    horizon = settings.context_window_s
    grid = static_grid(specs, cost, space, settings.policy, slo, horizon, speculation)
    static_params, static = best_of(grid)
    baselines = {name: evaluate_static(specs, cost, policy, knobs, slo, horizon)
                 for name, (policy, knobs) in VLLM_DEFAULTS.items()}
    goodput = {"tuned": tuned.goodput_rps, "best_static": static.goodput_rps,
               **{name: r.goodput_rps for name, r in baselines.items()},
               "per_phase_best": per_phase_best_goodput([r for _, r in grid], static.duration_s)}
    plain_knobs = {}
    if ablation or settings.policy == PLAIN_POLICY:
        plain_grid = grid if settings.policy == PLAIN_POLICY else \
            static_grid(specs, cost, space, PLAIN_POLICY, slo, horizon)
        plain_params, plain = best_of(plain_grid)
        goodput |= {"best_static_plain_budget": plain.goodput_rps, "per_phase_best_plain_budget":
                    per_phase_best_goodput([r for _, r in plain_grid], plain.duration_s)}
        plain_knobs = {"best_static_plain_budget_knobs": plain_params | {"policy": PLAIN_POLICY}}
    return {
        "goodput_rps": goodput,
        "ratio_tuned_over": {k: (goodput["tuned"] / v if v else None) for k, v in goodput.items() if k != "tuned"},
        "slo_attainment": {"tuned": tuned.slo_attainment, "best_static": static.slo_attainment,
                           **{name: r.slo_attainment for name, r in baselines.items()}},
        "unsafe_tuning_window_fraction": controller.violations / max(1, controller.windows),
        "exploring_unsafe_tuning_window_fraction":
            controller.exploring_violations / max(1, controller.exploring_windows),
        "violating_bin_fraction": {"tuned": violating_bin_fraction(records, slo),
                                   "best_static": static.violating_bin_fraction,
                                   **{n: r.violating_bin_fraction for n, r in baselines.items()}},
        "policy": settings.policy,
        "best_static_knobs": static_params,
        "good_requests_by_phase": {"tuned": good_by_phase(specs, records, slo), "best_static": static.good_by_phase,
                                   "per_phase_best": {phase: max(r.good_by_phase.get(phase, 0) for _, r in grid)
                                                      for phase in per_phase_best_knobs(grid)},
                                   **{n: r.good_by_phase for n, r in baselines.items()}},
        "per_phase_best_knobs": per_phase_best_knobs(grid),
        **plain_knobs,
        "tuning_windows": controller.windows,
        "regimes": regime_summaries(controller),
        "num_requests": len(specs),
        "simulated_s": round(duration, 1),
    }


def regime_summaries(controller: Controller) -> list[dict[str, Any]]:
    """Per regime: trials run and the configuration the controller settled on."""
    out = []
    for key in controller.state.regimes():
        study = controller.state.study_by_key(key)
        trials = study.get_trials(deepcopy=False)
        best = chosen_configuration(trials, controller.space, controller.settings.nothing_to_win)
        out.append({"regime": key, "trials": len(trials),
                    "completed": sum(t.state is TrialState.COMPLETE for t in trials),
                    "chosen": best[0] if best else None, "chosen_value": best[1] if best else None})
    return out
