"""What one replica sustains within the SLO, and the latencies it shows on the way there: the
profile the planner sizes the fleet with (Dynamo profiles prefill and decode throughput per GPU at
the TTFT and ITL targets; here one aggregated replica does both).

A profile is measured on the replica's step-time model (a hardware profile or a calibration) by
the simulator: the largest Poisson rate of the workload's mix at which `slo_target` of requests
meet their class's targets, and the mean TTFT and TPOT at fractions of it. Another mix is
converted by its work per request: prompt tokens not cached times the marginal prefill time per
token, plus output tokens times the decode time per token, both from the step-time model.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyPoint:
    utilization: float      # arrival rate / capacity
    ttft_s: float           # mean TTFT there
    tpot_s: float           # mean time per output token there


@dataclass(frozen=True)
class ReplicaCapacity:
    rate_rps: float                 # the profiled mix's sustainable rate within the SLO
    prompt_tokens: float            # the profiled mix: mean prompt, output, prefix hit rate
    output_tokens: float
    cached_fraction: float
    prefill_token_s: float          # replica time per uncached prompt token (at a large chunk)
    decode_token_s: float           # replica time per output token (at a typical decode batch)
    latency: tuple[LatencyPoint, ...] = ()   # increasing utilization

    def __post_init__(self) -> None:
        if not (self.rate_rps > 0 and self.prefill_token_s > 0 and self.decode_token_s > 0):
            raise ValueError("replica capacity: rate and per-token times must be > 0")

    @staticmethod
    def measured(rate_rps: float) -> ReplicaCapacity:
        """A rate measured on a live replica under its own traffic (`autotuned-serve capacity`),
        taken as it is: no profiled mix or per-token prices to convert it to another mix."""
        return ReplicaCapacity(rate_rps, 0.0, 0.0, 0.0, 1.0, 1.0)

    def work_s(self, prompt_tokens: float, output_tokens: float, cached_fraction: float,
               prefill_factor: float = 1.0, decode_factor: float = 1.0) -> float:
        """Replica time a request of this shape takes (its prefill and decode parts each scaled by
        their observed/predicted latency factor)."""
        prefill = prompt_tokens * (1 - min(max(cached_fraction, 0.0), 1.0)) * self.prefill_token_s
        return prefill * prefill_factor + output_tokens * self.decode_token_s * decode_factor

    def rate_for(self, prompt_tokens: float, output_tokens: float, cached_fraction: float,
                 prefill_factor: float = 1.0, decode_factor: float = 1.0) -> float:
        """Requests/s of this mix one replica sustains within the SLO."""
        profiled = self.work_s(self.prompt_tokens, self.output_tokens, self.cached_fraction)
        if profiled == 0:           # measured(): the rate as it is, slowed by what latency says
            return self.rate_rps / max(prefill_factor, decode_factor)
        observed = self.work_s(prompt_tokens, output_tokens, cached_fraction, prefill_factor, decode_factor)
        return self.rate_rps * profiled / observed if observed > 0 else self.rate_rps

    def predicted(self, utilization: float) -> tuple[float, float] | None:
        """(mean TTFT, mean TPOT) the profile shows at this utilization, linearly interpolated
        (held at the ends); None without a profile."""
        points = self.latency
        if not points:
            return None
        xs = [p.utilization for p in points]
        i = bisect.bisect_left(xs, utilization)
        if i == 0:
            return points[0].ttft_s, points[0].tpot_s
        if i == len(points):
            return points[-1].ttft_s, points[-1].tpot_s
        a, b = points[i - 1], points[i]
        w = (utilization - a.utilization) / (b.utilization - a.utilization)
        return a.ttft_s + w * (b.ttft_s - a.ttft_s), a.tpot_s + w * (b.tpot_s - a.tpot_s)
