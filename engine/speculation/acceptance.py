"""How likely a request's next drafted token is to be accepted, from what its verifications kept.

A drafted position is taken as accepted with one probability a per request (a geometric run length:
the j-th drafted token survives with a^j), estimated from decayed counts of accepted and rejected
positions (a verification of d drafts keeping m observes m acceptances and, if m < d, one rejection;
the positions after it are never tested). A request with no history starts from the acceptance of the
requests before it (AcceptanceTracker), itself seeded by the `acceptance_prior` knob, so a workload
whose drafts keep failing stops drafting for new requests too."""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_WEIGHT = 4.0    # the prior counts as this many observed positions in a request's estimate


@dataclass
class AcceptanceCounts:
    accepted: float = 0.0
    rejected: float = 0.0

    def observe(self, drafted: int, accepted: int, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.rejected = decay * self.rejected + (accepted < drafted)

    def rate(self, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        return (self.accepted + weight * prior) / (self.accepted + self.rejected + weight)


class AcceptanceTracker:
    """Per-request estimates, and the engine-wide one that new requests start from."""

    def __init__(self) -> None:
        self.overall = AcceptanceCounts()
        self._requests: dict[str, AcceptanceCounts] = {}

    def rate(self, request_id: str, prior: float) -> float:
        start = self.overall.rate(prior)
        counts = self._requests.get(request_id)
        return start if counts is None else counts.rate(start)

    def observe(self, request_id: str, drafted: int, accepted: int, decay: float) -> None:
        if drafted <= 0:
            return
        self._requests.setdefault(request_id, AcceptanceCounts()).observe(drafted, accepted, decay)
        self.overall.observe(drafted, accepted, decay)

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
