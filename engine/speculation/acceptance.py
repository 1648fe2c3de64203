"""How likely each drafted position of a request is to be kept, from what its verifications kept.

Drafts come in runs: where the output copies its input a draft tends to survive whole, and once the output
leaves its source the next few fail. So the estimate is per drafted position j: the chance h_j that token j
is kept given that the ones before it were (a hazard); the j-th survives with h_1 x ... x h_j. A
verification of d drafts keeping m tests positions 1..min(m + 1, d) and keeps 1..m; the counts decay by
`acceptance_decay` per verification. Each request's position j is its own count shrunk toward its pooled
rate (every position it tested alike: a geometric run), so a position it never tested takes that rate; the
pooled rate is shrunk toward the engine's over recent requests, itself seeded by the `acceptance_prior`
knob, so a workload whose drafts keep failing stops drafting for new requests too. Counts are kept apart by
whether the request's previous test kept every draft it tested ("in a run") or not: a run that has held
tends to go on, one that has broken tends to break again."""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_WEIGHT = 4.0    # a prior counts as this many tested positions against a request's own counts


@dataclass
class RunCounts:
    """Decayed counts per drafted position (index j - 1): verifications that tested it, and that kept it."""
    tested: list[float] = field(default_factory=list)
    kept: list[float] = field(default_factory=list)

    def observe(self, drafted: int, kept: int, decay: float) -> None:
        reached = min(kept + 1, drafted)
        grow = reached - len(self.tested)
        if grow > 0:
            self.tested += [0.0] * grow
            self.kept += [0.0] * grow
        for j in range(len(self.tested)):
            self.tested[j] = decay * self.tested[j] + (j < reached)
            self.kept[j] = decay * self.kept[j] + (j < kept)

    def pooled(self, prior: float) -> float:
        """Kept over tested across every position: the geometric rate, shrunk toward `prior`."""
        return (sum(self.kept) + PRIOR_WEIGHT * prior) / (sum(self.tested) + PRIOR_WEIGHT)

    def hazards(self, prior: float, n: int) -> list[float]:
        """h_1..h_n: each position's own counts shrunk toward `prior` (which positions never tested take)."""
        tested, kept = self.tested, self.kept
        return [(kept[j] + PRIOR_WEIGHT * prior) / (tested[j] + PRIOR_WEIGHT) if j < len(tested) else prior
                for j in range(n)]


@dataclass
class RequestRuns:
    in_run: bool = False                  # whether its previous test kept every draft it tested
    counts: dict[bool, RunCounts] = field(default_factory=lambda: {False: RunCounts(), True: RunCounts()})


NO_HISTORY = RequestRuns()      # read only: a request not yet tested


class AcceptanceTracker:
    """Per-request estimates, and the engine-wide ones that new requests start from."""

    def __init__(self) -> None:
        self.overall = {False: RunCounts(), True: RunCounts()}
        self._requests: dict[str, RequestRuns] = {}

    def survival(self, request_id: str, prior: float, n: int) -> tuple[float, ...]:
        """The chance that drafted tokens 1..n of the request's next proposal are all kept, for each
        length: non-increasing."""
        runs = self._requests.get(request_id) or NO_HISTORY
        start = self.overall[runs.in_run].pooled(prior)
        counts = runs.counts[runs.in_run]
        chance, out = 1.0, []
        for h in counts.hazards(counts.pooled(start), n):
            chance *= h
            out.append(chance)
        return tuple(out)

    def rate(self, request_id: str, prior: float) -> float:
        """The chance its next drafted token is kept."""
        return self.survival(request_id, prior, 1)[0]

    def observe(self, request_id: str, drafted: int, kept: int, decay: float) -> None:
        if drafted <= 0:
            return
        runs = self._requests.setdefault(request_id, RequestRuns())
        runs.counts[runs.in_run].observe(drafted, kept, decay)
        self.overall[runs.in_run].observe(drafted, kept, decay)
        runs.in_run = kept >= drafted

    def forget(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
