"""Before exploring a new regime live, search the calibrated simulator on the workload just observed
and hand the controller the best few configurations to try first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import optuna

from autotuner.objective import score, slo_excess
from autotuner.regime import Regime
from autotuner.search_space import SearchSpace
from autotuner.simulation import simulate
from autotuner.workload import RequestSpec
from engine.cost_model import CostModel
from engine.outputs import RequestRecord
from policies import Knobs
from telemetry.window import SLO, WindowSummary

NUM_REQUESTS = 200


def slo_token_budget(cost: CostModel, slo: SLO, space: SearchSpace, headroom: float) -> int | None:
    """Sarathi-Serve's rule, from the cost model before any traffic is seen: the largest budget (a
    tile multiple in the search space) whose step, a chunk of that many prompt tokens, is predicted
    within the TBT SLO less `headroom`; the space's lowest budget if none is. None if the budget is
    not tuned."""
    budget = next((r for r in space.ranges if r.name == "token_budget"), None)
    if budget is None:
        return None
    step = budget.step or 1
    fits = [b for b in range(int(budget.low), int(budget.high) + 1, step)
            if cost.predict_counts(b, 0, 1, b, b * (b + 1) // 2, 1) <= (1 - headroom) * slo.tbt_s]
    return max(fits, default=int(budget.low))


def observed_workload(samples: list[RequestRecord], rate_rps: float, seed: int = 0,
                      num_requests: int = NUM_REQUESTS) -> list[RequestSpec]:
    """Poisson arrivals at the observed rate, (prompt, output) lengths resampled from finished requests."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(samples), num_requests)
    arrivals = np.cumsum(rng.exponential(1.0 / rate_rps, num_requests))
    return [RequestSpec(float(t), samples[i].num_prompt_tokens, max(1, samples[i].num_output_tokens), "observed")
            for t, i in zip(arrivals, picks)]


class SimulatorWarmStart:
    def __init__(self, cost: Callable[[], CostModel], space: SearchSpace, slo: SLO, policy: str, base_knobs: Callable[[], Knobs],
                 samples: Callable[[float], list[RequestRecord]], trials: int, keep: int, seed: int = 0) -> None:
        self.cost, self.space, self.slo, self.policy = cost, space, slo, policy
        self.base_knobs, self.samples = base_knobs, samples
        self.trials, self.keep, self.seed = trials, keep, seed

    def __call__(self, regime: Regime, observed: WindowSummary) -> list[dict[str, Any]]:
        samples = self.samples(observed.seconds)
        if len(samples) < 5 or observed.arrival_rate_rps <= 0 or self.trials < 1:
            return []
        specs = observed_workload(samples, observed.arrival_rate_rps, self.seed)
        cost = self.cost()      # the live daemon's is scaled to the speed of its own recent steps
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=self.seed))
        study.optimize(lambda trial: self._objective(trial, specs, cost), n_trials=self.trials)
        return self._best(study)

    def _objective(self, trial: optuna.Trial, specs: list[RequestSpec], cost: CostModel) -> float:
        params = self.space.suggest(trial)
        knobs = self.base_knobs().replace(**{k: v for k, v in params.items() if k != "policy"})
        summary = simulate(specs, cost, params.get("policy", self.policy), knobs, self.slo).summary
        offered = summary.num_requests / summary.duration_s
        result = score(summary.goodput_rps, offered, summary.ttft_p50_s, summary.tbt_p99_s, self.slo)
        for name, value in result.constraints.items():
            trial.set_constraint(name, value)
        return result.value

    def _best(self, study: optuna.Study) -> list[dict[str, Any]]:
        """The best feasible configurations; when fewer than `keep` are feasible, the rest are those
        that missed the SLO by least (as the controller's incumbent rule), so a regime where nothing
        meets the SLO still starts next to the configuration that comes closest."""
        done = [t for t in study.trials if t.value is not None]
        excess = {t.number: slo_excess(t.constraints) for t in done}
        feasible = sorted((t for t in done if excess[t.number] == 0), key=lambda t: t.value, reverse=True)
        nearest = sorted((t for t in done if excess[t.number] > 0), key=lambda t: excess[t.number])
        best, seen = [], set()
        for t in feasible + nearest:
            params = self.space.snap(t.params)
            key = tuple(sorted(params.items()))
            if key not in seen:
                seen.add(key)
                best.append(params)
            if len(best) == self.keep:
                break
        return best
