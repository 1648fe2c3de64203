"""How many drafted tokens each decode verifies this step: the speculation length the load decides.

A decode that verifies j drafted tokens becomes j + 1 decode-shaped rows (each drafted position one
more query over the request's KV). The deadline policy prices the step it planned (decodes, then
prefill chunks in deadline order) with the step-time model, then gives drafted rows to the requests
whose next drafted token is likeliest to be kept (each offer carries the chance that its first j drafts
all survive, engine/speculation/acceptance.py): each in turn extends by the rows that raise the step's
expected tokens per second most (expected tokens against the predicted time they add, a chunk's prompt
tokens counted as the step's tokens) while the step still fits its target (step_headroom x the tightest
TBT slack, and the arrival guard). Prefill is planned first because a prompt's first token has a
deadline and a drafted token only saves time. At low load a decode step leaves the compute idle and rows
are cheap (the CPU kernels' time grows with the square root of the rows up to their crossover; a GPU's
decode step costs about the same for a few more), so requests draft long; as load grows the chunks fill
the steps, rows cost as much as what they might keep, or the slack is gone, and no request drafts
(k = 0). In `fixed` mode every decode verifies all the drafter offered, unpriced (vLLM's
`num_speculative_tokens`): the baseline the adaptive choice is measured against."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from typing import TYPE_CHECKING

from policies.view import SequenceState

if TYPE_CHECKING:
    from policies.deadline import StepTime


@dataclass(frozen=True)
class DraftOffer:
    seq: SequenceState
    survival: tuple[float, ...]   # chance its drafted tokens 1..j are all kept, for each j it could verify

    @property
    def available(self) -> int:
        """Drafted tokens it could verify (the drafter's proposal, capped by its room)."""
        return len(self.survival)


def fixed_lengths(offers: Sequence[DraftOffer], tokens_left: int) -> dict[str, int]:
    """Every offer whole, in order, within the step's token budget."""
    chosen = {}
    for offer in offers:
        k = min(offer.available, tokens_left)
        if k > 0:
            chosen[offer.seq.request_id] = k
            tokens_left -= k
    return chosen


def priced_lengths(offers: Sequence[DraftOffer], time: StepTime, target: float, work: int,
                   tokens_left: int) -> dict[str, int]:
    """Drafted rows added (to `time` too) by expected tokens kept, while they raise the step's tokens per
    second and the step fits `target`; `work`: the tokens the planned step computes for sure (one a decode,
    each prompt token of its chunks). The request whose next row is likeliest to be kept extends by the
    number of rows that raises the step's rate most, looking past rows that do not pay alone (a row's
    price falls as rows are added on the CPU kernels, and a long run's later rows are nearly as likely as
    its first); a request none of whose extensions pays drafts no further."""
    seconds, expected = time.seconds(), float(work)
    chosen = {offer.seq.request_id: 0 for offer in offers}
    heap = [(-offer.survival[0], i) for i, offer in enumerate(offers) if offer.available and offer.survival[0] > 0]
    heapq.heapify(heap)
    while heap and tokens_left > 0:
        _, i = heapq.heappop(heap)
        offer = offers[i]
        done = chosen[offer.seq.request_id]
        rows, longer, gain = best_extension(offer, done, time, target, seconds, expected, tokens_left)
        if not rows:
            continue
        for j in range(done + 1, done + rows + 1):
            time.add_draft(offer.seq, j)
        seconds, expected = longer, expected + gain
        chosen[offer.seq.request_id] = done + rows
        tokens_left -= rows
        if done + rows < offer.available:
            heapq.heappush(heap, (-offer.survival[done + rows], i))
    return {request_id: k for request_id, k in chosen.items() if k}


def best_extension(offer: DraftOffer, done: int, time: StepTime, target: float, seconds: float,
                   expected: float, tokens_left: int) -> tuple[int, float, float]:
    """The number of rows past its first `done` that gives the step the highest expected tokens per
    second within `target` (0 if none beats the step as it is), the step's time with them, their expected
    kept tokens."""
    best_rows, best_time, best_gain, gain = 0, seconds, 0.0, 0.0
    most = min(offer.available - done, tokens_left)
    for rows, longer in enumerate(time.with_drafts(offer.seq, done + 1, most), start=1):
        if longer > target:
            break
        gain += offer.survival[done + rows - 1]
        if (expected + gain) * best_time > (expected + best_gain) * longer:
            best_rows, best_time, best_gain = rows, longer, gain
    return best_rows, best_time, best_gain
