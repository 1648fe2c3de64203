"""Before exploring a new regime live, search the calibrated simulator on the workload just observed
and hand the controller the best few configurations to try first."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from autotuner.background import BackgroundRunner, throttle
from autotuner.objective import Score, score, slo_excess
from autotuner.regime import Regime
from autotuner.search_space import SearchSpace
from autotuner.static_grid import grid_points, speculation_points
from simulation.workload_run import simulate
from simulation.speculation_model import SpeculationModel
from loadgen.workload import RequestSpec
from simulation.cost_model import CostModel
from simulation.step_scatter import factor_at, sigma_of
from engine.outputs import RequestRecord
from engine.scheduling.error_budget import HORIZON_S as ERROR_BUDGET_HORIZON_S
from policies import Knobs
from policies.step_shape import attended_pairs, context_tokens
from engine.slo_class import SloClass
from telemetry.window import WindowSummary

log = logging.getLogger(__name__)
# The simulated horizon: long enough that a configuration short of the observed rate's capacity
# shows its growing queue in P50 TTFT (at 10% short, a quarter-minute of backlog after 4 minutes).
# 200 requests were ~35 s at GPU rates, where every configuration looked fine and the search
# handed over token caps that could not keep up (tuned 0.23x the best static on shift-gpu).
HORIZON_S = 240.0
MIN_REQUESTS = 200
MAX_REQUESTS = 2000


# The search simulates the observed rate this much higher: a window's rate is a Poisson estimate
# (+-15% at ~50 arrivals), its finished requests under-sample the long ones still running, and a
# configuration chosen with no capacity to spare breaks at the first burst, after which every
# window carries the backlog. Sarathi-Serve sizes budgets for the load to come, not the mean.
RATE_MARGIN = 1.25

# Configurations within this of the best simulated value are a tie: a search on a minute of observed
# requests cannot separate them (on the CPU's chat the defaults, as good as the best static
# configuration, were swapped for a cap of 160 scored 0.00002 higher, 10% behind it live in two
# windows, which held the matrix's convergence to 540 s). Ties are ranked at STRESS_MARGIN.
INCUMBENT_MARGIN = 0.01
# Ties are re-run at this many times the observed rate, near the capacity of a machine serving at
# 0.6 of it, where what one of them keeps that another does not shows as requests served. At
# RATE_MARGIN every tied candidate serves every request, and only the value's small queueing term
# differs: keeping the knobs serving on that alone held a 32-token cap on the CPU's multi-turn
# chat (its P50 TTFT twice the best's), 0.986x the best static configuration for 540 s.
STRESS_MARGIN = 2.0
MAX_TIED = 4        # tied candidates re-run at the stress rate, besides the knobs serving now
# A stress run resampled from fewer finished requests than a window needs (the controller's
# min_window_requests) ranks on their noise: on the CPU's diurnal day, 5 requests at dawn moved a
# start that served as well as the best static configuration to one 0.96x of it. The knobs serving
# then stay first while tied. On so few requests the search also runs no TPE trials, only the
# candidates given a priori (the knobs serving, the shipped defaults, the coarse grid): TPE fits
# them. On the CPU's summarization from a 32-token start, 5 requests at 60 s, it handed over a TPE
# sample, which the controller held (at such rates it keeps the warm start's first pick): the cell
# converged only at 2,850 s (benchmarks/zero_config.py, CPU summarization from sarathi-32).
MIN_STRESS_SAMPLES = 20


def horizon_requests(rate_rps: float) -> int:
    return int(min(MAX_REQUESTS, max(MIN_REQUESTS, rate_rps * HORIZON_S)))
optuna.logging.set_verbosity(optuna.logging.WARNING)   # in a background process too: no line per trial


def slo_token_budget(cost: CostModel, slo: SloClass, space: SearchSpace, headroom: float) -> int | None:
    """Sarathi-Serve's rule, from the cost model before any traffic is seen: the largest budget (a
    tile multiple in the search space) whose step, a chunk of that many prompt tokens, is predicted
    within the TBT SLO less `headroom`; the space's lowest budget if none is. None if the budget is
    not tuned."""
    budget = next((r for r in space.ranges if r.name == "token_budget"), None)
    if budget is None:
        return None
    step = budget.step or 1
    fits = [b for b in range(int(budget.low), int(budget.high) + 1, step)
            if cost.predict_counts(b, 0, 1, context_tokens(b, 0), attended_pairs(b, 0), 1) <= (1 - headroom) * slo.tbt_s]
    return max(fits, default=int(budget.low))


def observed_workload(lengths: list[tuple[int, ...]], rate_rps: float, seed: int = 0,
                      num_requests: int | None = None) -> list[RequestSpec]:
    """Poisson arrivals at the observed rate over the horizon, (prompt, output[, cached]) lengths
    resampled from finished requests. A request that found `cached` prompt tokens in the prefix
    cache starts with that many tokens of one shared prefix, so the simulated cache serves about
    the hits the live one did (a system prompt exactly; resent conversation histories, which were
    each their own, as if shared: the hit counts match, not which requests share)."""
    num_requests = horizon_requests(rate_rps) if num_requests is None else num_requests
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(lengths), num_requests)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, num_requests))
    return [_observed_spec(float(t), *lengths[i]) for t, i in zip(arrivals, picks)]


def _observed_spec(arrival_s: float, prompt: int, output: int, cached: int = 0) -> RequestSpec:
    return RequestSpec(arrival_s, prompt, max(1, output), "observed", prefix_group="observed" if cached else None,
                       prefix_tokens=min(cached, prompt))


@dataclass(frozen=True)
class WarmStartJob:
    """One search as plain data: what crosses to the background process the daemon runs it in."""

    cost: CostModel
    space: SearchSpace
    slo: SloClass
    policy: str
    knobs: dict[str, Any]              # the engine's knobs, which the tuned ones replace
    lengths: list[tuple[int, int, int]]  # (prompt, output, cached prompt) tokens of recently finished requests
    rate_rps: float
    trials: int
    keep: int
    seed: int = 0
    error_budget_horizon_s: float = ERROR_BUDGET_HORIZON_S   # the controller's context window, as the engine's
    serving_policy: str | None = None   # the engine's policy now, where it is not `policy` (a start on another)
    # how drafts fare (the daemon: configs/speculation.yaml's default workload, measured live): prices the
    # speculation knobs; None: the simulated engine has no drafter
    speculation: SpeculationModel | None = None


def search(job: WarmStartJob) -> list[dict[str, Any]]:
    """The Optuna search over simulated runs of the observed workload; the `keep` best configurations."""
    specs = observed_workload(job.lengths, RATE_MARGIN * job.rate_rps, job.seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=job.seed))
    # the knobs serving now are the first candidate, then the policy's coarse grid: a few dozen TPE
    # trials in six dimensions are mostly random, and on the shifting workload they handed over
    # configurations 0.67x as good (knobs serving now) and missed the grid point (cap 2048 at
    # headroom 1.0) that serves most on the A100 profile
    # (and, second, the shipped defaults: what ties fall back to when the knobs serving now are not among them)
    for point in [{}, shipped_defaults(job.space), *seed_points(job.policy, job.trials), *speculation_seeds(job)]:
        study.enqueue_trial(job.space.clamp(job.knobs | point | {"policy": job.policy}), skip_if_exists=True)

    def objective(trial: optuna.Trial) -> float:
        params = job.space.suggest(trial)
        result = simulated_score(job, specs, params)
        for name, value in result.constraints.items():
            trial.set_constraint(name, value)
        return result.value

    study.optimize(objective, n_trials=trials_to_run(job, study))
    serving_counts = job.serving_policy in (None, job.policy)
    return ties_ranked_under_stress(study, job.space, best_configurations(study, job.space, job.keep),
                                    stress_value(job), serving_counts)


def speculation_seeds(job: WarmStartJob) -> list[dict[str, Any]]:
    """Where drafts are modelled, the static grid's speculation settings (the space's knobs of them):
    TPE's few samples in a dozen dimensions seldom land on drafts off (2 of 17 lengths), and without
    them a start verifying 8 drafts on every decode (0.45x the goodput of none on the CPU's code
    editing) is never left."""
    return [] if job.speculation is None else speculation_points()


def thin_evidence(job: WarmStartJob) -> bool:
    """Fewer observed requests than MIN_STRESS_SAMPLES: too few to rank configurations on."""
    return len(job.lengths) < MIN_STRESS_SAMPLES


def trials_to_run(job: WarmStartJob, study: optuna.Study) -> int:
    """The trials asked; on thin evidence only the candidates enqueued a priori, no TPE sample."""
    if not thin_evidence(job):
        return job.trials
    return min(job.trials, len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))))


def shipped_defaults(space: SearchSpace) -> dict[str, Any]:
    """The search space's knobs at their shipped defaults (policies.Knobs()): the configuration
    nobody had to find."""
    return space.snap({})


def stress_value(job: WarmStartJob) -> Callable[[dict[str, Any]], float] | None:
    """A configuration's simulated value at STRESS_MARGIN times the observed rate; None with fewer
    than MIN_STRESS_SAMPLES observed requests to resample from."""
    if thin_evidence(job):
        return None
    stress = observed_workload(job.lengths, STRESS_MARGIN * job.rate_rps, job.seed + 1)
    return lambda params: simulated_score(job, stress, params).value


def simulated_score(job: WarmStartJob, specs: list[RequestSpec], params: dict[str, Any]) -> Score:
    """One configuration (search-space params over the engine's knobs) simulated on `specs`."""
    knobs = Knobs(**job.knobs).replace(**{k: v for k, v in params.items() if k != "policy"})
    summary = simulate(specs, job.cost, params.get("policy", job.policy), knobs, job.slo,
                       job.error_budget_horizon_s, job.speculation).summary
    throttle()      # in a background process: keep within its CPU share
    return score(summary.goodput_rps, summary.num_requests / summary.duration_s, summary.ttft_p50_s,
                 summary.tbt_p99_s, job.slo)


def seed_points(policy: str, trials: int) -> list[dict[str, Any]]:
    """The policy's static grid, thinned evenly to at most half of the search's trials (the rest
    are TPE's)."""
    grid = grid_points(policy)
    stride = math.ceil(len(grid) / max(1, trials // 2))
    return grid[::stride]


def best_configurations(study: optuna.Study, space: SearchSpace, keep: int) -> list[dict[str, Any]]:
    """The best feasible configurations by value; when fewer than `keep` are feasible, the rest are
    the best by value among those that missed the SLO. The search runs at RATE_MARGIN times the
    observed rate, so near capacity nothing may meet the SLO there: the value (the share of
    requests served within the SLO, less a penalty for latency over its bounds) then ranks by what
    the workload gets, where the smallest SLO excess had picked small steps that kept latency
    close to the bounds but served a third fewer requests."""
    done = [t for t in study.trials if t.value is not None]
    excess = {t.number: slo_excess(t.constraints) for t in done}
    feasible = sorted((t for t in done if excess[t.number] == 0), key=lambda t: t.value, reverse=True)
    nearest = sorted((t for t in done if excess[t.number] > 0), key=lambda t: t.value, reverse=True)
    best, seen = [], set()
    for t in feasible + nearest:
        params = space.snap(t.params)
        key = tuple(sorted(params.items()))
        if key not in seen:
            seen.add(key)
            best.append(params)
        if len(best) == keep:
            break
    return best


def ties_ranked_under_stress(study: optuna.Study, space: SearchSpace, best: list[dict[str, Any]],
                             stress_value: Callable[[dict[str, Any]], float] | None,
                             serving_counts: bool = True) -> list[dict[str, Any]]:
    """`best` with its head re-ranked: the configurations that met the SLO within INCUMBENT_MARGIN
    of the best value are ordered by `stress_value`, the kept one (tied_configurations: the knobs
    serving now, else the shipped defaults) first while within INCUMBENT_MARGIN of the best there
    too: a move the stress run cannot justify either risks what serves, or trades the defaults for
    a configuration no better on the evidence. Without a stress run (None), the kept one comes first."""
    tied, kept = tied_configurations(study, space, serving_counts)
    if len(tied) < 2:
        return best
    if stress_value is None:
        ranked = tied[:1] if kept else []
    else:
        values = [stress_value(params) for params in tied]
        order = sorted(range(len(tied)), key=lambda i: values[i], reverse=True)
        if kept and values[0] >= values[order[0]] - INCUMBENT_MARGIN:
            order = [0, *[i for i in order if i != 0]]
        ranked = [tied[i] for i in order]
    return [*ranked, *[p for p in best if p not in ranked]][:max(1, len(best))]


def tied_configurations(study: optuna.Study, space: SearchSpace,
                        serving_counts: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """The distinct configurations that met the SLO within INCUMBENT_MARGIN of the best value that
    did, up to MAX_TIED by value besides the kept one; and whether one is kept, first: the knobs
    serving now (the study's first trial) when among them, else the shipped defaults when among
    them. The knobs serving now count only where they serve under the tuned policy
    (`serving_counts`): a start on another policy (sarathi at 32 tokens) has them simulated under
    the tuned one, where they never served: on the CPU's diurnal day, tied on 5 observed requests,
    a 32-token cap on deadline steps was kept, and the cell converged at 22,860 s."""
    feasible = [t for t in study.trials if t.value is not None and slo_excess(t.constraints) == 0]
    if not feasible:
        return [], False
    top = max(t.value for t in feasible)
    near = [space.snap(t.params) for t in sorted(feasible, key=lambda t: t.value, reverse=True)
            if t.value >= top - INCUMBENT_MARGIN]
    serving = [space.snap(study.trials[0].params)] if serving_counts else []
    kept = next((p for p in (*serving, shipped_defaults(space)) if p in near), None)
    tied: list[dict[str, Any]] = [kept] if kept else []
    for params in near:
        if params not in tied and len(tied) < MAX_TIED + bool(kept):
            tied.append(params)
    return tied, kept is not None


Runner = Callable[[WarmStartJob], list[dict[str, Any]]]


class SimulatorWarmStart:
    """The controller's warm start: reads the live inputs (cost model, recent requests, knobs) on the
    caller's thread, then runs `search` through `runner`: in this process by default (the simulated
    controller, tests), in a background process in the daemon (`background_runner`)."""

    def __init__(self, cost: Callable[[], CostModel], space: SearchSpace, slo: SloClass, policy: str,
                 base_knobs: Callable[[], Knobs], samples: Callable[[float], list[RequestRecord]], trials: int,
                 keep: int, seed: int = 0, runner: Runner = search,
                 error_budget_horizon_s: float = ERROR_BUDGET_HORIZON_S,
                 base_policy: Callable[[], str] | None = None, speculation: SpeculationModel | None = None) -> None:
        self.cost, self.space, self.slo, self.policy = cost, space, slo, policy
        self.speculation = speculation         # how the served workload's drafts fare; None: no drafter
        self.base_knobs, self.samples = base_knobs, samples
        self.base_policy = base_policy or (lambda: policy)       # the engine's policy now
        self.trials, self.keep, self.seed, self.runner = trials, keep, seed, runner
        self.error_budget_horizon_s = error_budget_horizon_s

    def __call__(self, regime: Regime, observed: WindowSummary) -> list[dict[str, Any]]:
        job = self.job(observed)
        if job is None:
            return []
        log.info("tuner: warm start for %s: %d simulated trials on %d observed requests, %s", regime.key, job.trials,
                 len(job.lengths), scatter_line(job.cost.step_scatter))
        start = time.monotonic()
        best = self.runner(job)
        log.info("tuner: warm start done in %.1f s: %d configurations", time.monotonic() - start, len(best))
        return best

    def job(self, observed: WindowSummary) -> WarmStartJob | None:
        """The search's inputs; None when there is too little to search on."""
        samples = self.samples(observed.seconds)
        if len(samples) < 5 or observed.arrival_rate_rps <= 0 or self.trials < 1:
            return None
        knobs = {k: v for k, v in self.base_knobs().as_dict().items() if k != "version"}
        return WarmStartJob(self.cost(),    # the live daemon's is scaled to the speed of its own recent steps
                            self.space, self.slo, self.policy, knobs,
                            [(r.num_prompt_tokens, r.num_output_tokens, r.num_cached_tokens) for r in samples],
                            observed.arrival_rate_rps, self.trials, self.keep, self.seed,
                            self.error_budget_horizon_s, self.base_policy(), self.speculation)


def scatter_line(scatter: tuple[float, ...]) -> str:
    """How the simulated steps scatter, for the log."""
    if not scatter:
        return "steps exactly as predicted"
    return (f"steps scattered as live (sigma {sigma_of(scatter):.2f}: x{factor_at(scatter, 0.9):.2f} at p90, "
            f"x{factor_at(scatter, 0.99):.2f} at p99 of the median)")


class WarmStartFailed(RuntimeError):
    """The warm start's search failed in its background process (the cause is the message)."""


def background_runner(runner: BackgroundRunner, fn: Runner = search) -> Runner:
    """`fn` (the search) in `runner`'s child process; WarmStartFailed when the child fails or times out."""
    def run(job: WarmStartJob) -> list[dict[str, Any]]:
        best = runner.run(fn, job, fallback=None)
        if best is None:
            raise WarmStartFailed(runner.last_failure or "the background search failed")
        return best
    return run
