"""Deadline-aware steps (Niyama's per-step sizing, with the SLO percentile as an error budget).

Each step: every running decode first (stall-free, as Sarathi-Serve); then prefill chunks in
earliest-TTFT-deadline order, each as large as the step-time model predicts still fits
`step_headroom x` the tightest running decode's TBT slack (its class's TBT target minus the time
since its last token). A decode that just got a token can absorb a long step, a late one cannot.
No step is planned longer than the arrival guard (half the tightest class's TTFT target), so a
prompt of that class arriving during a step can wait it out and still make its TTFT: with no
interactive decode running, steps grow toward that bound (throughput), never to a whole 2048-token
step of a batch prompt. The token budget stays a hard cap.

With `ttft_pace` p > 0 a step carries no more prefill than keeps every waiting prompt's first token
p times faster than its deadline requires (the earliest-deadline-first pace of the queue, at the
step's predicted time), and never less than a chunk worth a step (MIN_PACED_CHUNK, the model's
tile): when prompts are far from their deadlines, steps stay short and every decode's token gap
with them, instead of filling the slack for a TTFT nobody needs. On a machine whose step time is
close to linear in tokens (the CPU kernels) a longer step buys no throughput, only longer gaps.

Two ways past the slack, both bounded:
- `prefill_priority` x budget is a floor of prefill tokens per step while prompts wait, so decode
  overload cannot stop admission (0 = deadlines only);
- a prompt whose TTFT the slack-sized pace would miss, and that steps of the largest chunk the
  arrival guard allows (the whole prompt, or as much of a longer one as fits the guard and the
  token cap) can still serve in time, gets such a step if the error budget (the long gaps the TBT
  percentile tolerates over the recent horizon, times `error_budget`) covers every decode the
  longer step makes late, and each of those decodes can take one more long gap with its own TBT
  percentile met. The budget counts gaps, not their length, so few large rescue steps spend less
  of it than many medium ones; a long prompt is rescued one step at a time, each paid when taken.

Queue order is earliest deadline first (arrival + the class's TTFT target), so a request is passed
only by requests whose deadline is earlier: a batch request (TTFT 30 s) by interactive ones
(TTFT 2 s) that arrived less than 28 s after it, never by later ones. Without a step-time model
the policy is Sarathi's under the budget, in deadline order.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from operator import attrgetter

from policies.draft_lengths import fixed_lengths, priced_lengths
from policies.knobs import Knobs
from policies.kv_reserve import blocks_to_keep_free
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.step_shape import WindowedShape, head_rows, shape_functions
from policies.view import SchedulerView, SequenceState, StepCost, remaining_tokens

UNBOUNDED = math.inf
MIN_PACED_CHUNK = 32   # paced prefill never takes smaller chunks: below this a step is mostly its decodes
PACE_PROBE = 64        # prefill tokens over which the per-token cost of a chunk is read off the model
BY_DEADLINE = attrgetter("ttft_deadline")


class StepTime:
    """The shape of the step planned so far (policies.step_shape summed, as the scheduler will),
    priced by the step-time model."""

    def __init__(self, cost: StepCost, shape: WindowedShape | None = None) -> None:
        self.cost = cost
        self.grammar_row_s = getattr(cost, "grammar_row_s", 0.0)
        self.context_tokens, self.attended_pairs = shape_functions(shape)
        self.prefill = self.decode = self.sampled = self.context = self.pairs = self.seqs = 0
        self.grammar_s = 0.0        # the masks of the constrained rows planned so far
        self.draft_rows, self.draft_s = 0, 0.0   # drafted rows priced by measured verification steps
        self.draft_row_s = getattr(cost, "draft_row_s", None)   # None: the model has no measured rows

    def add_decodes(self, decodes: Sequence[SequenceState], now: float) -> float:
        """Adds them; returns the smallest TBT slack among them (their TBT target minus the time since
        their last token; unbounded if none has a token yet). One pass: every decode, every step."""
        context = pairs = constrained = 0
        slack = UNBOUNDED
        context_tokens, attended_pairs = self.context_tokens, self.attended_pairs
        for seq in decodes:
            c = seq.num_computed_tokens
            context += context_tokens(1, c)
            pairs += attended_pairs(1, c)
            last = seq.last_token_time
            if last is not None:
                slack = min(slack, seq.tbt_target_s - (now - last))
            if seq.grammar is not None:
                constrained += 1
        self.grammar_s += constrained * self.grammar_row_s
        n = len(decodes)
        self.decode += n
        self.sampled += n
        self.context += context
        self.pairs += pairs
        self.seqs += n
        return slack

    def seconds(self) -> float:
        return self.cost.predict_counts(self.prefill, self.decode, self.sampled, self.context, self.pairs,
                                        self.seqs) + self.grammar_s + self.draft_s

    def with_chunk(self, seq: SequenceState, n: int) -> float:
        """The step's predicted time if `seq` also gets an `n`-token prefill chunk."""
        c = seq.num_computed_tokens
        return self.cost.predict_counts(self.prefill + n, self.decode, self.sampled + head_rows(n, c, seq),
                                        self.context + self.context_tokens(n, c),
                                        self.pairs + self.attended_pairs(n, c), self.seqs + 1) \
            + self.grammar_s + self.draft_s + self._chunk_grammar_s(seq, n, c)

    def add_chunk(self, seq: SequenceState, n: int) -> None:
        c = seq.num_computed_tokens
        self.grammar_s += self._chunk_grammar_s(seq, n, c)
        self.prefill += n
        self.sampled += head_rows(n, c, seq)
        self.context += self.context_tokens(n, c)
        self.pairs += self.attended_pairs(n, c)
        self.seqs += 1

    def with_drafts(self, seq: SequenceState, first: int, most: int) -> Iterator[float]:
        """The step's predicted time if decode `seq` also verifies its drafted tokens first..first + n - 1,
        for n = 1..most in turn: each one more decode-shaped row, at context c + j (policies/draft_lengths.py);
        priced by the measured verification steps where the model has them, else as one more decode."""
        seconds, c = self.seconds(), seq.num_computed_tokens + first
        grammar_s = self.grammar_row_s if seq.grammar is not None else 0.0
        tokens = self.prefill + self.decode + self.draft_rows
        context = pairs = 0
        for n in range(most):
            row_s = self._row_s(tokens + n, c + n)
            if row_s is not None:
                seconds += row_s + grammar_s
                yield seconds
                continue
            context += self.context_tokens(1, c + n)
            pairs += self.attended_pairs(1, c + n)
            yield self.cost.predict_counts(self.prefill, self.decode + n + 1, self.sampled + n + 1,
                                           self.context + context, self.pairs + pairs, self.seqs + n + 1) \
                + self.grammar_s + self.draft_s + (n + 1) * grammar_s

    def add_draft(self, seq: SequenceState, j: int) -> None:
        self.grammar_s += self.grammar_row_s if seq.grammar is not None else 0.0
        row_s = self._measured_row_s(seq, j)
        if row_s is not None:
            self.draft_rows += 1
            self.draft_s += row_s
            return
        c = seq.num_computed_tokens + j
        self.decode += 1
        self.sampled += 1
        self.context += self.context_tokens(1, c)
        self.pairs += self.attended_pairs(1, c)
        self.seqs += 1

    def _measured_row_s(self, seq: SequenceState, j: int) -> float | None:
        return self._row_s(self.prefill + self.decode + self.draft_rows, seq.num_computed_tokens + j)

    def _row_s(self, tokens: int, context: int) -> float | None:
        return None if self.draft_row_s is None else self.draft_row_s(tokens, context)

    def _chunk_grammar_s(self, seq: SequenceState, n: int, c: int) -> float:
        """A chunk that reaches a constrained request's last token samples one masked row."""
        return self.grammar_row_s if seq.grammar is not None and c + n == seq.num_tokens else 0.0

    def largest_chunk(self, seq: SequenceState, limit: int, target: float) -> int:
        """The largest chunk of at most `limit` tokens whose step fits `target` (binary search:
        the predicted time only grows with the chunk)."""
        if limit <= 0 or self.with_chunk(seq, 1) > target:
            return 0
        if self.with_chunk(seq, limit) <= target:
            return limit
        fits, over = 1, limit
        while over - fits > 1:
            mid = (fits + over) // 2
            fits, over = (mid, over) if self.with_chunk(seq, mid) <= target else (fits, mid)
        return fits

    def on_tile(self, seq: SequenceState, n: int) -> int:
        """`n` rounded down to the model's tile where that costs less per prefill token (a GPU GEMM
        of 136 rows costs about what 256 do); a prompt's last chunk is kept whole."""
        tile = self.cost.tile_tokens
        if tile <= 1 or n <= tile or n % tile == 0 or n == remaining_tokens(seq):
            return n
        down, base = n - n % tile, self.seconds()
        return down if (self.with_chunk(seq, down) - base) / down <= (self.with_chunk(seq, n) - base) / n else n


def candidates_of(step: StepBuilder, view: SchedulerView) -> tuple[list[SequenceState], set[int]]:
    """Prompts part-way through their prefill and waiting ones, earliest TTFT deadline first (on a
    tie, partial ones first); and the ids of the partial ones. The queue is sorted with a C-level
    key and the few partial prompts inserted: an overloaded queue holds thousands, every step."""
    partial = step.partial_prefills()
    ordered = sorted(view.waiting, key=BY_DEADLINE)
    for seq in reversed(sorted(partial, key=BY_DEADLINE)):   # each before its equals: ties keep their order
        bisect.insort_left(ordered, seq, key=BY_DEADLINE)
    return ordered, {id(seq) for seq in partial}


class DeadlinePolicy:
    name = "deadline"
    help = ("deadline-aware: decodes first, then prefill chunks in TTFT-deadline order sized by the cost model "
            "to the tightest TBT slack; the TBT percentile's error budget pays for rescuing late prompts")
    knobs = ("token_budget", "max_num_seqs", "step_headroom", "error_budget", "ttft_pace", "prefill_priority",
             "max_partial_prefills", "long_prefill_token_threshold", "kv_admission_watermark", "speculative_tokens",
             "speculative_mode", "acceptance_prior", "acceptance_decay")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        decodes = step.schedule_decodes()
        time = StepTime(view.cost, view.step_shape) if view.cost else None
        target = UNBOUNDED
        if time:
            # each decode's own step-time target is headroom x its TBT slack; the step fits the smallest
            target = min(knobs.step_headroom * time.add_decodes(decodes, view.now), view.arrival_guard_s)
        self._prefills(step, view, knobs, time, target, decodes)
        if view.draft_offers is not None:
            self._drafts(step, view, knobs, time, target, decodes)
        return step.plan

    @staticmethod
    def _drafts(step: StepBuilder, view: SchedulerView, knobs: Knobs, time: StepTime | None, target: float,
                decodes: list[SequenceState]) -> None:
        """After prefill: the drafted tokens each decode verifies (policies/draft_lengths.py) in what the
        chunks left of the slack, a prompt token counting as much of the step's work as an emitted one
        (so under load, where chunks fill the steps, drafts must beat prefill); adaptive needs the
        step-time model."""
        adaptive = knobs.speculative_mode == "adaptive"
        if adaptive and (time is None or time.seconds() >= target):   # no model, or no slack left: no row fits
            return
        offers = view.draft_offers(decodes)
        if not offers:
            return
        if adaptive:
            lengths = priced_lengths(offers, time, target, len(decodes) + time.prefill, step.tokens_left)
        else:
            lengths = fixed_lengths(offers, step.tokens_left)
        for offer in offers:
            if lengths.get(offer.seq.request_id):
                step.add_drafts(offer.seq, lengths[offer.seq.request_id])

    def _prefills(self, step: StepBuilder, view: SchedulerView, knobs: Knobs, time: StepTime | None,
                  target: float, decodes: list[SequenceState]) -> None:
        floor = round(knobs.prefill_priority * knobs.token_budget)
        candidates, partial = candidates_of(step, view)
        paced = self._paced_tokens(time, candidates, view.now, knobs.ttft_pace) \
            if time and knobs.ttft_pace > 0 else UNBOUNDED
        spendable = math.floor(knobs.error_budget * view.tolerated_long_gaps) - view.long_gaps
        cap = knobs.long_prefill_token_threshold or knobs.token_budget
        keep = blocks_to_keep_free(step, view, knobs.kv_admission_watermark, view.output_share)
        num_partial, prefilled = len(partial), 0
        partial_ahead = len(partial)        # partial prompts not yet reached in deadline order
        for seq in candidates:
            waiting = id(seq) not in partial
            if waiting and num_partial >= knobs.max_partial_prefills:
                if not partial_ahead:
                    return
                # no slot for a new prompt, but a partial one due later still runs: stopping here
                # scheduled nothing at all while a prompt due earlier waited (a deadlock, seen on
                # the CPU's mixed-classes: batch prompts part-way, interactive ones queued ahead)
                continue
            partial_ahead -= not waiting
            need = remaining_tokens(seq)
            room = min(step.tokens_left, cap, need)
            if room <= 0:
                return
            n = time.largest_chunk(seq, min(room, max(paced - prefilled, 0)), target) if time else room
            n = max(n, min(room, floor - prefilled))
            rescue = time.largest_chunk(seq, room, view.arrival_guard_s) if time else 0
            rescued = (time is not None and n < rescue and time.seconds() <= target
                       and self._at_risk(time, seq, n, view.now)
                       and not self._at_risk(time, seq, rescue, view.now)
                       and self._affordable(self._late_decodes(time, seq, rescue, decodes, view.now,
                                                               knobs.step_headroom), spendable))
            n = rescue if rescued else time.on_tile(seq, n) if time else n
            if n <= 0:
                return
            if not (step.admit(seq, n, keep) if waiting else step.schedule(seq, n)):
                return
            num_partial += waiting
            prefilled += n
            if time:
                time.add_chunk(seq, n)
            if rescued:
                return       # the step is as long as the budget paid for; nothing more rides on it

    @staticmethod
    def _paced_tokens(time: StepTime, candidates: list[SequenceState], now: float,
                      pace: float) -> float:
        """Prefill tokens this step needs for the queue to keep `pace` x the earliest-deadline-first
        rate its deadlines need: the largest (prompt tokens due by a deadline) / (time to it). A step
        of P prefill tokens takes T0 + c P (T0: its decodes; c: a chunk's cost per token), so the
        rate P / (T0 + c P) reaches r at P = r T0 / (1 - r c); unbounded where r c >= 1 or a
        deadline has passed (the slack alone sizes the step)."""
        if not candidates:
            return 0
        due, rate = 0, 0.0
        for seq in candidates:
            due += remaining_tokens(seq)
            left = seq.ttft_deadline - now
            if left <= 0:
                return UNBOUNDED
            rate = max(rate, due / left)
        base, first = time.seconds(), candidates[0]
        per_token = max(time.with_chunk(first, PACE_PROBE) - base, 0.0) / PACE_PROBE
        r = pace * rate
        if r * per_token >= 1:
            return UNBOUNDED
        return max(math.ceil(r * base / (1 - r * per_token)), MIN_PACED_CHUNK, time.cost.tile_tokens)

    @staticmethod
    def _at_risk(time: StepTime, seq: SequenceState, n: int, now: float) -> bool:
        """At `n` tokens a step (steps of this length), the prompt's first token comes after its deadline."""
        if n <= 0:
            return True
        steps = math.ceil(remaining_tokens(seq) / n)
        return now + steps * time.with_chunk(seq, n) > seq.ttft_deadline

    @staticmethod
    def _late_decodes(time: StepTime, seq: SequenceState, n: int, decodes: list[SequenceState], now: float,
                      headroom: float) -> list[SequenceState]:
        """Running decodes whose target (headroom x TBT slack) the step with this chunk overruns and
        the step without it does not: the long gaps the error budget pays for."""
        with_chunk, without = time.with_chunk(seq, n), time.seconds()
        return [d for d in decodes if d.last_token_time is not None
                and without <= headroom * (d.tbt_target_s - (now - d.last_token_time)) < with_chunk]

    @staticmethod
    def _affordable(late: list[SequenceState], spendable: int) -> bool:
        """The window's budget covers them, and each can take one more long gap with its own TBT
        percentile met (goodput judges every request by its own gaps)."""
        return len(late) <= spendable and all(d.spare_long_gaps > 0 for d in late)
