"""How many drafted tokens each decode verifies this step: the speculation length the load decides.

A decode that verifies j drafted tokens becomes j + 1 decode-shaped rows (each drafted position one
more query over the request's KV). The deadline policy prices the step it planned (decodes, then
prefill chunks in deadline order) with the step-time model, then adds drafted rows one at a time, each
to the request whose next drafted token is likeliest to be kept (its acceptance estimate a: the j-th
survives with a^j), for as long as the row raises the step's tokens per second (its expected tokens g
against the predicted time it adds: g / dt > tokens / time so far, a chunk's prompt tokens counted
as the step's tokens) and the step still fits its target (step_headroom x the tightest TBT slack, and
the arrival guard). Prefill is planned first because a prompt's first token has a deadline and a
drafted token only saves time. At low load a decode step leaves the compute idle and rows are cheap
(the CPU kernels' time grows with the square root of the rows up to their crossover; a GPU's decode
step costs about the same for a few more), so requests draft long; as load grows the chunks fill the
steps, rows cost as much as what they might keep, or the slack is gone, and no request drafts (k = 0). In `fixed` mode every decode verifies
all the drafter offered, unpriced (vLLM's `num_speculative_tokens`): the baseline the adaptive choice
is measured against."""

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
    available: int          # drafted tokens it could verify (the drafter's proposal, capped by its room)
    acceptance: float       # its estimated per-token acceptance


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
    """Drafted rows added greedily (to `time` too) by expected tokens kept, while they raise the step's
    tokens per second and the step fits `target`; `work`: the tokens the planned step computes for sure
    (one a decode, each prompt token of its chunks)."""
    seconds, expected = time.seconds(), float(work)
    chosen = {offer.seq.request_id: 0 for offer in offers}
    heap = [(-offer.acceptance, i) for i, offer in enumerate(offers) if offer.available > 0 and offer.acceptance > 0]
    heapq.heapify(heap)
    while heap and tokens_left > 0:
        gain, i = heapq.heappop(heap)
        gain = -gain
        offer = offers[i]
        j = chosen[offer.seq.request_id] + 1
        longer = time.with_draft(offer.seq, j)
        if longer > target or gain * seconds <= expected * (longer - seconds):
            break          # the likeliest row left does not pay: no less likely one does
        time.add_draft(offer.seq, j)
        seconds, expected = longer, expected + gain
        chosen[offer.seq.request_id] = j
        tokens_left -= 1
        if j < offer.available:
            heapq.heappush(heap, (-gain * offer.acceptance, i))
    return {request_id: k for request_id, k in chosen.items() if k}
