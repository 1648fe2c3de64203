"""One replica's answer to the planner each interval: what finished there lately and how well.
Sums, not means, so the ingress adds replicas' answers up before dividing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from telemetry.window import meets_slo


@dataclass(frozen=True)
class ReplicaTelemetry:
    finished: int = 0
    met: int = 0                 # within their SLO class's targets
    ttft_sum_s: float = 0.0
    tpot_sum_s: float = 0.0
    tpot_count: int = 0          # requests with more than one output token
    kv_usage: float = 0.0

    @staticmethod
    def of(records: Sequence[RequestRecord], slo: SloClass, kv_usage: float) -> ReplicaTelemetry:
        ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
        tpots = [(r.finished - r.first_token) / (r.num_output_tokens - 1) for r in records
                 if r.first_token is not None and r.num_output_tokens > 1]
        return ReplicaTelemetry(len(records), sum(meets_slo(r, slo) for r in records), sum(ttfts), sum(tpots),
                                len(tpots), kv_usage)

    @staticmethod
    def total(answers: Iterable[ReplicaTelemetry]) -> ReplicaTelemetry:
        answers = list(answers)
        if not answers:
            return ReplicaTelemetry()
        return ReplicaTelemetry(sum(a.finished for a in answers), sum(a.met for a in answers),
                                sum(a.ttft_sum_s for a in answers), sum(a.tpot_sum_s for a in answers),
                                sum(a.tpot_count for a in answers), sum(a.kv_usage for a in answers) / len(answers))
