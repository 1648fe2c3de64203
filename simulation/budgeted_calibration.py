"""The daemon's start-up calibration, in a wall-clock budget whatever the model's size.

`calibrate` measures a fixed sample of grid points: ~0.5 s a point on the bundled 135M model on
2 cores, ~10 s on a 1.5B one, whose start-up calibration of 60 points so took ten minutes of /health
503. Here the whole calibration gets `budget_s` (the daemon's `calibration_budget_s`, 60 s by
default), in phases:

1. the quantized kernels' crossover (a quantized engine whose config does not fix it), until
   CROSSOVER_SHARE of the budget; stopped early, the start-up's per-matrix guess stands above the
   largest row count measured;
2. the verification steps of drafted tokens (simulation/verify_rows.py), for VERIFY_SHARE of the budget;
3. grid points until GRID_END_SHARE: each point's time is predicted (PointCost: the shipped fit's
   parts, each scaled to the steps measured so far on each weights path, the cheapest first) and a point
   is measured only where it fits the time left and leaves time for MIN_GRID_POINTS points in all.
   A slow model so gets fewer points, and its dearest shapes are left out until there is time for
   them; steps of seconds are timed once, without an untimed run before;
4. the steps of a few live requests whose prompts and outputs are sized to what is left, aborted at
   the budget;
5. the fit, on what was measured. With fewer than MIN_FIT_POINTS grid points there is no shape to
   fit: CalibrationTooShort, and the daemon serves as with --no-calibrate (the shipped shape at the
   live speed).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import replace

import numpy as np

from engine.llm_engine import LLMEngine
from simulation.calibrate import (DECODE_CONTEXTS, WARMUP_MAX_S, GridPoint, engine_meta, grid, live_steps, measure,
                                  measure_step_crossover)
from simulation.cost_model import FEATURES, CostModel, StepShape, fit_cost_model
from simulation.cost_model_files import SHIPPED_COST_MODEL
from simulation.verify_rows import measure_verify_rows

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 60.0
CROSSOVER_SHARE = 0.25     # the kernels' crossover is measured until this share of the budget
VERIFY_SHARE = 0.10       # of the budget for the verification steps (simulation/verify_rows.py), timed once each
GRID_END_SHARE = 0.75      # grid points until this share; the rest for live steps and the fit
MIN_GRID_POINTS = 12       # while fewer are measured, a point may take at most the grid time left / those missing
MIN_FIT_POINTS = len(FEATURES) + 1   # fewer grid points: too few to fit the shape of a step's cost
SAFETY = 1.25              # predictions are taken this much higher when deciding what fits
FIT_RESERVE_S = 0.5        # kept at the end for the fit and the save
POOL_PER_POINT = 4         # grid points drawn per point wanted, so that dear ones can be passed over
LIVE_PROMPTS = (400, 256, 128, 64, 32, 16)   # the live requests' longest prompt: the largest that fits
MIN_LIVE_OUTPUT = 4


class CalibrationTooShort(RuntimeError):
    """The budget measured too few steps to fit a cost model on."""


class PointCost:
    """Predicted seconds of a step: the shipped fit's parts (its constant; the linear layers' tokens,
    square root, sampled rows and sequences; attention's context and pairs), each times a factor
    fitted (non-negative least squares on relative error) to the steps measured here, per weights
    path: the quantized kernels' steps and the dense ones scale apart (a dense step of a big
    quantized model first dequantizes every layer, seconds of constant). A factor the steps do not
    determine takes their median ratio to the shipped fit, as every factor does until three steps
    are measured; none is taken below a quarter of it. A path without a measured step borrows the
    other's factors; before any, the shipped fit as it is."""

    PARTS = ((0,), (1, 2, 3, 6), (4, 5))     # FEATURES' indices: constant, linear layers, attention

    def __init__(self, prior: CostModel, kernel_max_rows: int = 0) -> None:
        self.prior, self.kernel_max_rows = prior, kernel_max_rows
        self._seen: dict[bool, list[tuple[tuple[float, ...], float]]] = {True: [], False: []}
        self._factors: dict[bool, tuple[float, ...]] = {}

    def _parts(self, shape: StepShape) -> tuple[float, ...]:
        f, c = shape.features(), self.prior.coefficients
        return tuple(sum(c[i] * f[i] for i in part) for part in self.PARTS)

    def on_kernels(self, shape: StepShape) -> bool:
        return 0 < shape.num_prefill_tokens + shape.num_decode_tokens <= self.kernel_max_rows

    def observe(self, shape: StepShape, seconds: float, on_kernels: bool | None = None) -> None:
        path = self.on_kernels(shape) if on_kernels is None else on_kernels
        seen = self._seen[path]
        seen.append((self._parts(shape), max(seconds, 1e-6)))
        shared = statistics.median(t / sum(parts) for parts, t in seen)
        factors = np.full(len(self.PARTS), shared)
        if len(seen) >= len(self.PARTS):
            from scipy.optimize import nnls   # on first use: scipy's import is tens of MB resident
            fitted, _ = nnls(np.array([[part / t for part in parts] for parts, t in seen]), np.ones(len(seen)))
            factors = np.where(fitted > 0, np.maximum(fitted, shared / 4), shared)
        self._factors[path] = tuple(float(f) for f in factors)

    def predict(self, shape: StepShape) -> float:
        path = self.on_kernels(shape)
        factors = self._factors.get(path) or self._factors.get(not path) or (1.0,) * len(self.PARTS)
        return sum(f * part for f, part in zip(factors, self._parts(shape)))

    def measured(self, shape: StepShape) -> bool:
        """Whether a step on this shape's path was measured."""
        return bool(self._seen[self.on_kernels(shape)])


def calibrate_within(engine: LLMEngine, budget_s: float = DEFAULT_BUDGET_S, num_points: int = 60,
                     live_requests: int = 4, holdout_fraction: float = 0.2, seed: int = 0,
                     retakes: int | None = 0) -> CostModel:
    """Calibrate `engine` in about `budget_s` seconds of wall time (one measure a point, no re-takes on
    a busy machine: the live speed factor corrects for it later): up to `num_points` grid points and
    up to `live_requests` requests' steps. Raises CalibrationTooShort where too few steps fit."""
    start = time.monotonic()
    end = start + budget_s
    cost = PointCost(CostModel.load(SHIPPED_COST_MODEL))
    blocks = engine.block_manager
    if engine.runner.quantized_path and engine.config.quantized_max_rows is None:
        measure_step_crossover(engine, 1, retakes, deadline=start + CROSSOVER_SHARE * budget_s, observe=cost.observe)
    cost.kernel_max_rows = engine.runner.quantized_max_rows
    verify_rows = measure_verify_rows(engine, time.monotonic() + VERIFY_SHARE * budget_s, repeats=1)
    pool = grid(blocks.num_free_blocks, blocks.block_size, engine.config.max_token_budget,
                POOL_PER_POINT * num_points, seed, engine.max_model_len, cost.kernel_max_rows)
    grid_end = start + GRID_END_SHARE * budget_s

    def runs_s(point: GridPoint) -> float:
        """Predicted seconds to measure the point: one timed run, and an untimed one before a short step."""
        step_s = cost.predict(point.shape())
        return SAFETY * step_s * (1 + (step_s <= WARMUP_MAX_S))

    shapes: list[StepShape] = []
    seconds: list[float] = []
    probes = _probes(pool, cost)       # the cheapest of each weights path first: the others are priced from them
    for point in probes:
        if time.monotonic() + (runs_s(point) if cost.measured(point.shape()) else 0.0) > grid_end:
            continue
        _measure_into(engine, point, cost, shapes, seconds, retakes)
    pool = [p for p in pool if p not in probes]
    planned, planned_s = _pick_all(pool, runs_s, grid_end - time.monotonic(), len(shapes), num_points)
    live_left = end - FIT_RESERVE_S - (time.monotonic() + planned_s)
    live_s = _live_plan(live_requests, cost, live_left)[3]
    expected = min(budget_s, time.monotonic() - start + planned_s + live_s + FIT_RESERVE_S)
    log.info("calibration: %d grid points measured, about %d more (%.0f s), then live steps (%.0f s): "
             "about %.0f s in all, %.0f s at most", len(shapes), len(planned), planned_s, live_s, expected, budget_s)
    while len(shapes) < num_points:
        point = _pick(pool, runs_s, grid_end - time.monotonic(), len(shapes))
        if point is None:
            break
        pool.remove(point)
        _measure_into(engine, point, cost, shapes, seconds, retakes)
    grid_points = len(shapes)
    if grid_points < MIN_FIT_POINTS:
        raise CalibrationTooShort(f"{grid_points} grid points measured in {time.monotonic() - start:.0f} s of a "
                                  f"{budget_s:.0f} s budget; {MIN_FIT_POINTS} are needed to fit a cost model")
    requests, prompt, outputs, _ = _live_plan(live_requests, cost, end - FIT_RESERVE_S - time.monotonic())
    if requests:
        records = live_steps(engine, requests, seed, prompt, outputs, deadline=end - FIT_RESERVE_S)
    else:
        log.info("calibration: no time left for live steps")
        records = []
    shapes += [StepShape.of(r) for r in records]
    seconds += [r.duration_s for r in records]
    model = fit_cost_model(shapes, seconds, holdout_fraction, seed, **engine_meta(engine))
    took = time.monotonic() - start
    log.info("calibration: %d grid points and %d live steps in %.1f s (budget %.0f s)", grid_points, len(records),
             took, budget_s)
    return replace(model, verify_rows=verify_rows, notes=model.notes | {"calibration": f"start-up, budget {budget_s:g} s",
                                               "calibration_s": f"{took:.1f}", "grid_points": str(grid_points),
                                               "live_steps": str(len(records))})


def _probes(pool: list[GridPoint], cost: PointCost) -> list[GridPoint]:
    """The point the shipped fit prices cheapest on each weights path in the pool, kernels first."""
    paths: dict[bool, GridPoint] = {}
    for point in sorted(pool, key=lambda p: cost.prior.predict(p.shape())):
        paths.setdefault(cost.on_kernels(point.shape()), point)
    return [paths[path] for path in (True, False) if path in paths]


def _pick(pool: list[GridPoint], runs_s, time_left: float, measured: int) -> GridPoint | None:
    """The next point in the pool's (random) order that fits within the time left over the points
    still missing up to MIN_GRID_POINTS; failing one, the cheapest that fits the time left."""
    if time_left <= 0 or not pool:
        return None
    cap = time_left / max(MIN_GRID_POINTS - measured, 1)
    for point in pool:
        if runs_s(point) <= cap:
            return point
    cheapest = min(pool, key=runs_s)
    return cheapest if runs_s(cheapest) <= time_left else None


def _pick_all(pool: list[GridPoint], runs_s, time_left: float, measured: int,
              num_points: int) -> tuple[list[GridPoint], float]:
    """The points `_pick` would take in turn if the predictions held, and their predicted seconds."""
    pool, picked, total = list(pool), [], 0.0
    while measured + len(picked) < num_points:
        point = _pick(pool, runs_s, time_left - total, measured + len(picked))
        if point is None:
            break
        pool.remove(point)
        picked.append(point)
        total += runs_s(point)
    return picked, total


def _measure_into(engine: LLMEngine, point: GridPoint, cost: PointCost, shapes: list[StepShape],
                  seconds: list[float], retakes: int | None) -> None:
    warmup = not cost.measured(point.shape()) or cost.predict(point.shape()) <= WARMUP_MAX_S
    shape, t = measure(engine, point, 1, retakes, warmup)
    cost.observe(shape, t)
    shapes.append(shape)
    seconds.append(t)


def _live_plan(num_requests: int, cost: PointCost, time_left: float) -> tuple[int, int, int, float]:
    """(requests, longest prompt, most output tokens, predicted seconds) of the live steps: as many of
    `num_requests` requests as fit, with the longest prompt of LIVE_PROMPTS whose predicted prefill
    takes at most half the time left, and as many output tokens as the other half holds; (0, 0, 0, 0)
    where not even one short request fits."""
    for requests in range(num_requests, 0, -1):
        for prompt in LIVE_PROMPTS:
            prefill_s = SAFETY * cost.predict(GridPoint(0, DECODE_CONTEXTS[0], requests * prompt, 0).shape())
            decode_s = SAFETY * cost.predict(GridPoint(requests, prompt, 0, 0).shape())
            outputs = min(128, int(time_left / 2 / decode_s))
            if prefill_s <= time_left / 2 and outputs >= MIN_LIVE_OUTPUT:
                # prompts and outputs are drawn uniformly up to these: about half of each on average
                predicted = (prefill_s + (outputs + min(8, outputs)) / 2 * decode_s) / SAFETY
                return requests, prompt, outputs, predicted
    return 0, 0, 0, 0.0
