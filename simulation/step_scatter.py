"""How far live step times scatter around the cost model's predictions, and that scatter in the
simulator.

On the 2-core daemon a step takes +-20-40% of what the model predicts for its shape (other threads,
the HTTP server, caches): on a 2-core Xeon the 90th percentile of live over predicted was 1.28-1.38x
its median and the 99th 1.75-1.80x (the warm starts' log lines in
docs/results/live_static_grid_xeon/scatter_refine/daemon-tuned.tuner.log). So the scheduler prices
deadlines at the TBT SLO's percentile, the 99th (simulation.live_cost_model): a step over the TBT
target gives every decode in it a long gap, so slack-filled steps may overrun no more often than one
request's own P99 tolerates, and with `step_headroom`'s margin fewer than one in a hundred do. A simulator that runs every step exactly as predicted has no such overruns. With the
scatter in it, each simulated step takes the prediction times a draw from the live ratios (about
their median), and the simulated scheduler prices at the same percentile as the live one. For
what-ifs only: the pooled ratios are mostly those of decode steps, which scatter far more than
slack-filling prefill steps (docs/results/step_ratios_xeon.json), so drawn i.i.d. they overrun long
steps that live do not, and the warm start simulates without them (docs/design/cost_models.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

# The live scheduler prices steps at this percentile of live over predicted; the simulated one too.
DEADLINE_QUANTILE = 0.99
SIGMA_QUANTILE = 0.9                 # scatter_sigma: the lognormal spread with the same 90th percentile
PERCENTILES = tuple(range(1, 100))   # the scatter is kept as live over predicted at these, over the median
MAX_FACTOR = 10.0                    # a step 10x its median is a stall, not scatter


def measured_scatter(ratios: Sequence[float]) -> tuple[float, ...]:
    """Live over predicted step times (each path's own median taken out) at PERCENTILES, over their median."""
    if len(ratios) == 0:
        return ()
    values = np.percentile(np.asarray(ratios, dtype=float), PERCENTILES)
    return tuple(float(min(MAX_FACTOR, v)) for v in values / np.median(ratios))


def lognormal_scatter(sigma: float) -> tuple[float, ...]:
    """A lognormal scatter of median 1 and log-spread `sigma`, at PERCENTILES (for what-ifs)."""
    normal = NormalDist()
    return tuple(math.exp(sigma * normal.inv_cdf(p / 100)) for p in PERCENTILES) if sigma > 0 else ()


def factor_at(scatter: Sequence[float], quantile: float) -> float:
    """The scatter's factor at `quantile` (interpolated between PERCENTILES; 1 without scatter)."""
    return float(np.interp(100 * quantile, PERCENTILES, scatter)) if scatter else 1.0


def sigma_of(scatter: Sequence[float]) -> float:
    """The lognormal log-spread that has the same 90th percentile: one number to show."""
    return math.log(factor_at(scatter, SIGMA_QUANTILE)) / NormalDist().inv_cdf(SIGMA_QUANTILE) if scatter else 0.0


class StepScatter:
    """The simulator's step-time factors: seeded draws from the scatter's percentiles (a run repeats);
    beyond the 1st and 99th percentile the draws take those ends."""

    BLOCK = 4096     # drawn in blocks: one numpy call per step costs more than the step's bookkeeping

    def __init__(self, scatter: Sequence[float], seed: int = 0) -> None:
        self.scatter = np.asarray(scatter, dtype=float)
        self._rng = np.random.default_rng(seed)
        self._draws: list[float] = []

    def factor(self) -> float:
        if not self._draws:
            self._draws = np.interp(self._rng.uniform(0, 100, self.BLOCK), PERCENTILES, self.scatter).tolist()
        return self._draws.pop()
