"""Admission from predicted time to first token: refuse at once what cannot be served in time.

When a request arrives its TTFT is predicted from the work ahead of it in the deadline policy's
order (each prompt, waiting or part-way, whose TTFT deadline is no later than its own, and its own
prompt), priced by the scheduler's step-time model as the deadline policy sizes steps: each step
carries the running decodes and as much prefill as fits `step_headroom` x the tightest running TBT
target (at most the arrival guard and the token budget). Where the running slots (`max_num_seqs`)
are all taken, the wait for the slots it needs is priced too (the running requests' output left,
at that step time). The prediction is scaled by a correction learned from the TTFTs admitted
requests then observe, as the live cost model corrects the step-time model: a running estimate of
the 90th percentile of observed / predicted (Robbins-Monro, moving at most one step per 0.25 s however
many first tokens come), so nine in ten admitted requests get their first token no later than
predicted. The bound adapts to what is measured, not a fixed queue length.

A request whose corrected prediction exceeds `admission_slack` x its class's TTFT target (or its own
prefill time, where that alone is longer) is refused (429) with Retry-After = the predicted excess,
the time the queue ahead needs to drain that far; a batch request is judged against its own, looser
target. `admission_slack` 0 turns admission off.

Queued requests of a class whose `late` rule is "shed" are ended once their TTFT deadline passes
before their prefill began: they have already missed, and serving them takes capacity from those
that can still make theirs. Classes whose rule is "serve" (batch) are served late, never lost.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.scheduling.request import Request, RequestStatus
from policies.deadline import MIN_PACED_CHUNK, StepTime
from policies.view import remaining_tokens

if TYPE_CHECKING:
    from engine.scheduling.scheduler import Scheduler

SHED_PREDICTED = "predicted_ttft"     # its predicted TTFT is over its class's target
SHED_EXPIRED = "expired"              # queued past its TTFT deadline, its class's rule is to end it
SHED_QUEUE_FULL = "queue_full"        # the waiting queue is at max_waiting
CORRECTION_QUANTILE = 0.9            # the correction tracks this quantile of observed / predicted TTFT
CORRECTION_STEP = 0.05                # log-correction moved per observation (a stochastic quantile estimate) ...
CORRECTION_SPACING_S = 0.25           # ... at most one observation's worth this often: faster, and the feedback
                                      # it waits a TTFT for swings the correction between its bounds
CORRECTION_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True)
class Admission:
    """What admission decided for one request; `retry_after_s` only when it was refused."""

    admitted: bool
    predicted_ttft_s: float | None = None     # corrected; None without a step-time model (admitted)
    retry_after_s: float = 0.0
    reason: str | None = None


ADMITTED = Admission(True)


@dataclass(frozen=True)
class TtftPrediction:
    total_s: float      # from now to the request's first token, behind the work ahead of it
    own_s: float        # its own prefill on an idle engine


def bound_s(prediction: TtftPrediction, slack: float, request: Request) -> float:
    """The longest predicted TTFT admitted: `slack` x the class's target, and never less than the request's
    own prefill, so a prompt too long for its target alone is served (late) when nothing is ahead of it
    instead of being refused by every replica, however often it retries."""
    return max(slack * request.slo.ttft_s, prediction.own_s)


class AdmissionControl:
    """One per scheduler: `decide` runs on the thread a request arrives on (it only reads the queues),
    `observe` and `expired` on the one that steps the engine."""

    def __init__(self) -> None:
        self._log_correction = 0.0
        self._last_observed: float | None = None
        self._lock = threading.Lock()
        self.on_shed: list[Callable[[str, str], None]] = []               # (slo class, reason)
        self.on_observed: list[Callable[[float, float, float], None]] = []   # (predicted, observed, correction)

    @property
    def correction(self) -> float:
        return math.exp(self._log_correction)

    def decide(self, request: Request, scheduler: Scheduler, now: float,
               pending: Iterable[Request] = ()) -> Admission:
        """Admit, or refuse with the time to come back. `pending`: requests accepted but not yet in
        the scheduler's queues (they are ahead of this one like queued ones)."""
        slack = scheduler.latest_knobs.admission_slack
        if slack <= 0:
            return ADMITTED
        prediction = self.predict(request, scheduler, now, pending)
        if prediction is None:
            return ADMITTED
        predicted, target = prediction.total_s, bound_s(prediction, slack, request)
        if predicted <= target:
            request.predicted_ttft_s = predicted
            return Admission(True, predicted)
        self.count_shed(request.slo.name, SHED_PREDICTED)
        return Admission(False, predicted, predicted - target, SHED_PREDICTED)

    def retry_after(self, request: Request, scheduler: Scheduler, now: float,
                    pending: Iterable[Request] = ()) -> float:
        """For a refusal on another ground (a full queue): the predicted time until this request
        would make its target; 0 without a step-time model."""
        prediction = self.predict(request, scheduler, now, pending)
        if prediction is None:
            return 0.0
        slack = scheduler.latest_knobs.admission_slack or 1.0
        return max(0.0, prediction.total_s - bound_s(prediction, slack, request))

    def predict(self, request: Request, scheduler: Scheduler, now: float,
                pending: Iterable[Request] = ()) -> TtftPrediction | None:
        """The corrected prediction of the request's TTFT from now; None without a step-time model."""
        raw = predict_ttft(request, scheduler, now, tuple(pending))
        return None if raw is None else TtftPrediction(raw.total_s * self.correction, raw.own_s * self.correction)

    def observe(self, request: Request, first_token: float) -> None:
        """An admitted request's first token came: move the correction toward observed / predicted."""
        predicted = request.predicted_ttft_s
        if predicted is None:
            return
        observed = first_token - request.arrival_time
        late = observed > predicted
        low, high = CORRECTION_BOUNDS
        with self._lock:   # up by q when it came later than predicted, down by 1 - q when not: P(later) -> 1 - q
            step = CORRECTION_STEP * self._weight(first_token)
            moved = self._log_correction + step * (CORRECTION_QUANTILE if late else CORRECTION_QUANTILE - 1)
            self._log_correction = min(max(moved, math.log(low)), math.log(high))
        for listener in self.on_observed:
            listener(predicted, observed, self.correction)

    def _weight(self, now: float) -> float:
        """An observation's share of a full step: 1 where they come CORRECTION_SPACING_S apart or more, less where
        they come faster (a GPU serving a hundred requests a second), so the correction moves at most about
        CORRECTION_STEP per CORRECTION_SPACING_S whatever the request rate."""
        last, self._last_observed = self._last_observed, now
        return 1.0 if last is None else min(1.0, max(0.0, now - last) / CORRECTION_SPACING_S)

    def expired(self, scheduler: Scheduler, now: float) -> list[Request]:
        """Queued requests to end now: never scheduled, past their TTFT deadline, of a class whose
        `late` rule is "shed" (only while admission is on); never a fork of n > 1, whose parent started."""
        if scheduler.knobs.admission_slack <= 0:
            return []
        late = [r for r in scheduler.waiting
                if r.slo.late == "shed" and r.ttft_deadline < now and r.timings.first_scheduled is None
                and r.follows is None
                and r.status is RequestStatus.WAITING]
        for r in late:
            self.count_shed(r.slo.name, SHED_EXPIRED)
        return late

    def count_shed(self, slo_class: str, reason: str) -> None:
        for listener in self.on_shed:
            listener(slo_class, reason)


def predict_ttft(request: Request, scheduler: Scheduler, now: float, pending: tuple[Request, ...] = ()
                 ) -> TtftPrediction | None:
    """Seconds from now to the request's first token, from the queues as they are (read without a
    lock: a step's staleness is within the prediction's error) and the scheduler's step-time model."""
    cost = scheduler.cost
    if cost is None:
        return None
    knobs = scheduler.latest_knobs
    running, waiting = tuple(scheduler.running), tuple(scheduler.waiting) + pending
    decodes = [r for r in running if r.num_computed_tokens >= r.num_prompt_tokens]
    deadline = request.ttft_deadline
    ahead = [r for r in waiting if r.ttft_deadline <= deadline and r is not request]
    partial = [r for r in running if r.num_computed_tokens < r.num_prompt_tokens and r.ttft_deadline <= deadline]
    work = remaining_tokens(request) + sum(map(remaining_tokens, ahead)) + sum(map(remaining_tokens, partial))
    time = StepTime(cost, scheduler.shape)
    time.add_decodes(decodes, now)
    tbt = min((r.tbt_target_s for r in decodes), default=math.inf)   # no decode running: steps up to the guard
    target = min(knobs.step_headroom * tbt, scheduler.arrival_guard_s)
    limit = max(1, knobs.token_budget - len(decodes))
    chunk = max(time.largest_chunk(request, limit, target), min(limit, MIN_PACED_CHUNK))
    own = remaining_tokens(request)
    total_s = max(_prefill_s(time, request, work, chunk),
                  _slot_wait_steps(running, len(ahead), knobs.max_num_seqs) * time.seconds()
                  + _prefill_s(time, request, own, chunk))
    idle = StepTime(cost, scheduler.shape)
    idle_chunk = min(knobs.token_budget, max(idle.largest_chunk(request, own, scheduler.arrival_guard_s),
                                             min(own, MIN_PACED_CHUNK)))   # an idle engine's steps: up to the guard
    return TtftPrediction(total_s, _prefill_s(idle, request, own, idle_chunk))


def _prefill_s(time: StepTime, request: Request, tokens: int, chunk: int) -> float:
    """`tokens` of prefill in steps of `chunk` beside what `time` holds, the last step priced at its own size."""
    full, rest = divmod(tokens, chunk)
    return full * time.with_chunk(request, chunk) + (time.with_chunk(request, rest) if rest else 0.0)


def _slot_wait_steps(running: tuple[Request, ...], num_ahead: int, max_num_seqs: int) -> int:
    """With every running slot taken, the steps until enough running requests finish (each at most its
    max_tokens, one token a step) for the requests ahead and this one."""
    need = num_ahead + 1 - (max_num_seqs - len(running))
    if need <= 0 or not running:
        return 0
    left = sorted(r.max_tokens - r.num_output_tokens for r in running)
    rounds, index = divmod(need - 1, len(left))
    return rounds * left[-1] + left[index]
