"""Each step's drafts: after the policy has planned the step, the drafter's proposals for its decodes
and the length each verifies (policies/draft_lengths.py), priced with the scheduler's step-time model
against the same target the deadline policy sizes steps to."""

from __future__ import annotations

from collections.abc import Sequence

from engine.speculation.acceptance import AcceptanceTracker
from engine.speculation.ngram_drafter import NgramDrafter
from engine.structured.drafted_grammar import allowed_drafts
from policies.deadline import StepTime
from policies.draft_lengths import DraftOffer, fixed_lengths, priced_lengths
from policies.knobs import Knobs
from policies.view import SchedulerView, SequenceState


class Speculator:
    def __init__(self, drafter: NgramDrafter | None = None) -> None:
        self.drafter = drafter or NgramDrafter()
        self.acceptance = AcceptanceTracker()

    def drafts(self, decodes: Sequence, chunks: Sequence[tuple[SequenceState, int]], view: SchedulerView,
               knobs: Knobs, tokens_left: int) -> dict[str, list[int]]:
        """request_id -> the drafted tokens it verifies this step, for the planned `decodes` (requests) beside
        the planned prefill `chunks` ((request, tokens)); none without a step-time model in adaptive mode."""
        adaptive = knobs.speculative_mode == "adaptive"
        if knobs.speculative_tokens <= 0 or tokens_left <= 0 or (adaptive and view.cost is None):
            return {}
        proposals = {r.request_id: self._proposal(r, knobs.speculative_tokens) for r in decodes}
        offers = [DraftOffer(r, len(proposals[r.request_id]),
                             self.acceptance.rate(r.request_id, knobs.acceptance_prior))
                  for r in decodes if proposals[r.request_id]]
        if not offers:
            return {}
        if adaptive:
            time = StepTime(view.cost, view.step_shape)
            slack = time.add_decodes(list(decodes), view.now)
            for seq, n in chunks:
                time.add_chunk(seq, n)
            target = min(knobs.step_headroom * slack, view.arrival_guard_s)
            # a prompt's tokens are work the step does as much as an emitted token: drafts must beat both
            work = len(decodes) + sum(n for _, n in chunks)
            lengths = priced_lengths(offers, time, target, work, tokens_left)
        else:
            lengths = fixed_lengths(offers, tokens_left)
        return {request_id: proposals[request_id][:k] for request_id, k in lengths.items()}

    def _proposal(self, request, most: int) -> list[int]:
        room = min(most, request.max_tokens - request.num_output_tokens - 1)
        drafts = self.drafter.propose(request.request_id, request.prompt_token_ids, request.output_token_ids, room)
        if drafts and request.grammar is not None:     # only what its grammar allows: every row is masked anyway
            drafts = allowed_drafts(request.grammar, drafts)
        return drafts

    def observe(self, request_id: str, drafted: int, accepted: int, knobs: Knobs) -> None:
        self.acceptance.observe(request_id, drafted, accepted, knobs.acceptance_decay)

    def forget(self, request_id: str) -> None:
        self.drafter.forget(request_id)
        self.acceptance.forget(request_id)
