"""What one more drafted row costs a step: measured steps of one decode verifying drafts.

A decode verifying k drafted tokens runs k + 1 decode-shaped rows (engine/speculation/verification.py).
The fitted step-time model prices a row through seven coefficients fitted on a few dozen grid points
(simulation/cost_model.py); its marginal row at the small row counts speculation lives at is far off
(on the 1.5B file, 2 cores, a start-up fit priced a step of 17 rows at 2.5x its measured time, so the
deadline policy drafted nothing). Here the start-up calibration times the verification step itself:
one sequence of `contexts` tokens verifying `rows - 1` drafts, for each of ROWS. A drafted row added to
a step of T rows costs the table's step(T + 1) - step(T) at the row's context (piecewise linear in
rows, extrapolated along the last segment; linear in context between the two measured, attention's
cost being linear in it)."""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams
from engine.scheduling.request import Request
from engine.scheduling.scheduler import ScheduledRequest
from simulation.step_timing import timed_runs

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

ROWS = (1, 2, 3, 5, 9, 17)       # verification rows: k = 0, 1, 2, 4, 8, 16 drafts
CONTEXTS = (64, 1024)            # a short context and a long one (capped to the model's length)
REPEATS = 3                      # timed runs a shape, median; one untimed run first


@dataclass(frozen=True)
class VerifyRows:
    rows: tuple[int, ...]
    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]    # [context][row count], non-decreasing in rows

    def step_s(self, rows: float, context: float) -> float:
        """Seconds of a step of `rows` decode rows at `context` tokens each."""
        at = [_along(self.rows, s, rows) for s in self.seconds]
        if len(at) == 1 or self.contexts[0] == self.contexts[-1]:
            return at[0]
        (c0, c1), (t0, t1) = (self.contexts[0], self.contexts[-1]), (at[0], at[-1])
        return t0 + (t1 - t0) * (context - c0) / (c1 - c0)

    def row_s(self, tokens: int, context: int) -> float:
        """Seconds one more row at `context` adds to a step of `tokens` rows (never negative)."""
        return max(self.step_s(tokens + 1, context) - self.step_s(tokens, context), 0.0)

    def scaled(self, factor: float) -> VerifyRows:
        return replace(self, seconds=tuple(tuple(t * factor for t in s) for s in self.seconds))

    @staticmethod
    def from_dict(data: dict | None) -> VerifyRows | None:
        if not data:
            return None
        return VerifyRows(tuple(data["rows"]), tuple(data["contexts"]), tuple(tuple(s) for s in data["seconds"]))


def _along(xs: tuple[int, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the points, extended along the first and last segments."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    (x0, x1), (y0, y1) = (xs[i - 1], xs[i]), (ys[i - 1], ys[i])
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def measure_verify_rows(engine: LLMEngine, deadline: float | None = None, repeats: int = REPEATS) -> VerifyRows | None:
    """Times the verification steps (ROWS at each of CONTEXTS) until `deadline` (time.monotonic());
    None where not even two row counts at one context could be measured. A context's row counts stop
    where the next would end past the deadline (its predicted time: the last one's, doubled)."""
    contexts = sorted({min(c, engine.max_model_len - ROWS[-1] - 1) for c in CONTEXTS})
    measured: list[tuple[float, ...]] = []
    rows_done = ROWS
    for context in contexts:
        times: list[float] = []
        for rows in rows_done:
            last_s = times[-1] if times else 0.0
            if deadline is not None and time.monotonic() + 2 * (repeats + 1) * last_s > deadline:
                break
            times.append(max(_step_s(engine, context, rows, repeats), last_s))
        if len(times) < 2:
            break
        rows_done = rows_done[:len(times)]          # every context on the same row counts
        measured = [s[:len(times)] for s in measured] + [tuple(times)]
    if not measured:
        log.info("calibration: no time to measure verification steps; drafted rows are priced by the fit")
        return None
    table = VerifyRows(rows_done, tuple(contexts[:len(measured)]), tuple(measured))
    log.info("calibration: verification steps (rows: ms) %s", "; ".join(
        f"context {c}: " + ", ".join(f"{r}: {t * 1e3:.1f}" for r, t in zip(table.rows, s))
        for c, s in zip(table.contexts, table.seconds)))
    return table


def _step_s(engine: LLMEngine, context: int, rows: int, repeats: int) -> float:
    """Median seconds of one decode at `context` verifying `rows - 1` drafted tokens."""
    request = Request("verify", [0] * context, SamplingParams(max_tokens=rows + 1, ignore_eos=True))
    request.num_computed_tokens = context
    request.output_token_ids.append(0)
    request.draft_token_ids = [0] * (rows - 1)
    scheduled = [ScheduledRequest(request, rows, context, rows - 1)]
    blocks = engine.block_manager
    blocks.grow(request.block_table, context + rows)
    try:
        engine.runner.execute(scheduled)       # untimed: a new shape's set-up
        return statistics.median(timed_runs(engine, scheduled, repeats))
    finally:
        blocks.free(request.block_table)
