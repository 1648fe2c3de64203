"""Each step's drafts: the drafter's proposals for the step's decodes, offered to the policy (which
prices how many of each to verify, policies/draft_lengths.py) with each request's chance of keeping them,
and kept until the scheduler lays out the verification rows."""

from __future__ import annotations

from collections.abc import Sequence

from engine.speculation.acceptance import AcceptanceTracker
from engine.speculation.ngram_drafter import NgramDrafter
from engine.structured.drafted_grammar import allowed_drafts
from policies.draft_lengths import DraftOffer
from policies.knobs import Knobs


class Speculator:
    def __init__(self, drafter: NgramDrafter | None = None) -> None:
        self.drafter = drafter or NgramDrafter()
        self.acceptance = AcceptanceTracker()
        self._proposals: dict[str, list[int]] = {}     # this step's, by request

    def offers(self, decodes: Sequence, knobs: Knobs) -> list[DraftOffer]:
        """The planned decodes that have a proposal, each with the chance its drafts survive, by length."""
        self._proposals = {r.request_id: self._proposal(r, knobs.speculative_tokens) for r in decodes}
        return [DraftOffer(r, self.acceptance.survival(r.request_id, knobs.acceptance_prior,
                                                       len(self._proposals[r.request_id])))
                for r in decodes if self._proposals[r.request_id]]

    def drafted(self, request_id: str, k: int) -> list[int]:
        """The first `k` tokens of the request's proposal this step."""
        return self._proposals.get(request_id, [])[:k]

    def _proposal(self, request, most: int) -> list[int]:
        room = min(most, request.max_tokens - request.num_output_tokens - 1)
        drafts = self.drafter.propose(request.request_id, request.prompt_token_ids, request.output_token_ids, room)
        if drafts and request.grammar is not None:     # only what its grammar allows: every row is masked anyway
            drafts = allowed_drafts(request.grammar, drafts)
        return drafts

    def untested(self, scheduled: Sequence) -> list[tuple[str, int]]:
        """The step's decodes that had a proposal and verified none of it: (request id, its first drafted
        token). Their sampled token tests that draft all the same (Speculator.observe of one drafted
        token), so a request the pricing keeps from drafting still has its acceptance measured: a prior
        too low to pay for a row would otherwise never be corrected. Consumes the step's proposals."""
        proposals, self._proposals = self._proposals, {}
        return [(s.request.request_id, proposals[s.request.request_id][0]) for s in scheduled
                if not s.num_drafts and proposals.get(s.request.request_id)]

    def begin_step(self) -> None:
        """A new step: the last one's proposals (offered, maybe never run) are dropped."""
        self._proposals = {}

    def observe(self, request_id: str, drafted: int, accepted: int, knobs: Knobs) -> None:
        self.acceptance.observe(request_id, drafted, accepted, knobs.acceptance_decay)

    def forget(self, request_id: str) -> None:
        self.drafter.forget(request_id)
        self.acceptance.forget(request_id)
