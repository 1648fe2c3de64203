"""One replica's answer to the planner each interval: what finished there lately and how well.
Sums, not means, so the ingress adds replicas' answers up before dividing.

Latencies (TTFT, TPOT) are those of the tightest SLO class among the finished requests, the class
the fleet is sized for: the deadline policy lets a looser class's requests decode slower within
their own TBT target, which a mean over every class would read as a slower replica (mixed-classes
days sized with 0.8 of the profiled capacity per replica for it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from telemetry.window import meets_slo


@dataclass(frozen=True)
class ReplicaTelemetry:
    finished: int = 0
    met: int = 0                 # within their SLO class's targets
    ttft_sum_s: float = 0.0      # of the tightest class's requests
    tpot_sum_s: float = 0.0
    tpot_count: int = 0          # the tightest class's requests with more than one output token
    kv_usage: float = 0.0
    ttft_count: int = 0          # the tightest class's requests with a first token
    latency_class: tuple[float, float] = (math.inf, math.inf)   # that class's (TBT, TTFT) targets

    @staticmethod
    def of(records: Sequence[RequestRecord], slo: SloClass, kv_usage: float) -> ReplicaTelemetry:
        tight = tightest_class(records)
        latency_class = _targets(tight[0]) if tight else (math.inf, math.inf)
        ttfts = [r.ttft_s for r in tight if r.ttft_s is not None]
        tpots = [(r.finished - r.first_token) / (r.num_output_tokens - 1) for r in tight
                 if r.first_token is not None and r.num_output_tokens > 1]
        return ReplicaTelemetry(len(records), sum(meets_slo(r, slo) for r in records), sum(ttfts), sum(tpots),
                                len(tpots), kv_usage, len(ttfts), latency_class)

    @staticmethod
    def total(answers: Iterable[ReplicaTelemetry]) -> ReplicaTelemetry:
        """The replicas' answers added up; latencies only from those of the tightest class any reported."""
        answers = list(answers)
        if not answers:
            return ReplicaTelemetry()
        tightest = min(a.latency_class for a in answers)
        timed = [a for a in answers if a.latency_class == tightest]
        return ReplicaTelemetry(sum(a.finished for a in answers), sum(a.met for a in answers),
                                sum(a.ttft_sum_s for a in timed), sum(a.tpot_sum_s for a in timed),
                                sum(a.tpot_count for a in timed), sum(a.kv_usage for a in answers) / len(answers),
                                sum(a.ttft_count for a in timed), tightest)

    @property
    def ttft_mean_s(self) -> float | None:
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    @property
    def tpot_mean_s(self) -> float | None:
        return self.tpot_sum_s / self.tpot_count if self.tpot_count else None

    @property
    def attainment(self) -> float | None:
        return self.met / self.finished if self.finished else None


def tightest_class(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records of the class with the smallest TBT target (then TTFT target) among them; a
    record without targets is judged by the reader's SLO and counts as the loosest."""
    if not records:
        return []
    tightest = min(_targets(r) for r in records)
    return [r for r in records if _targets(r) == tightest]


def _targets(r: RequestRecord) -> tuple[float, float]:
    return (r.slo_tbt_s if r.slo_tbt_s is not None else math.inf,
            r.slo_ttft_s if r.slo_ttft_s is not None else math.inf)
