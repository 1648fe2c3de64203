"""What the planner reads of the fleet each interval: the same fields from the live ingress and
from the fleet simulator, so the planner is tested and tuned without Ray."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.replica_telemetry import ReplicaTelemetry


@dataclass(frozen=True)
class FleetTelemetry:
    interval_s: float
    arrivals: int                     # requests that arrived in the interval
    prompt_tokens: float = 0.0        # their mean prompt length
    output_tokens: float = 0.0        # their mean max_tokens (the output they may generate)
    cached_fraction: float = 0.0      # prefix hit rate: prompt tokens found cached / prompt tokens
    kv_usage: float = 0.0             # mean KV-cache usage of the serving replicas (0-1)
    finished: int = 0                 # requests that finished in the interval
    ttft_s: float | None = None       # mean TTFT of the tightest SLO class among them
    tpot_s: float | None = None       # its mean time per output token after the first
    attainment: float | None = None   # share of them within their SLO class's targets
    serving: int = 0                  # replicas taking requests
    starting: int = 0                 # replicas loading their model
    queued_tokens: float = 0.0        # work waiting for a first token, at the replicas and the ingress, now
                                      # (prompt + max_tokens of each waiting request, as the router's load)
    shed: int = 0                     # of the arrivals, those every replica tried shed (answered 429)

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or min(self.arrivals, self.finished, self.queued_tokens, self.shed) < 0:
            raise ValueError("telemetry: interval_s must be > 0, arrivals, finished, queued_tokens and shed >= 0")

    @staticmethod
    def of(interval_s: float, arrivals: int, prompt_tokens: int, output_tokens: int, cached_tokens: int,
           replicas: ReplicaTelemetry, serving: int, starting: int, queued_tokens: float = 0.0,
           shed: int = 0) -> FleetTelemetry:
        """From an interval's arrivals (counts and token sums) and the replicas' summed answers."""
        n = arrivals
        return FleetTelemetry(interval_s, n, prompt_tokens / n if n else 0.0, output_tokens / n if n else 0.0,
                              cached_tokens / prompt_tokens if prompt_tokens else 0.0, replicas.kv_usage,
                              replicas.finished, replicas.ttft_mean_s, replicas.tpot_mean_s, replicas.attainment,
                              serving, starting, queued_tokens, shed)

    @property
    def rate_rps(self) -> float:
        return self.arrivals / self.interval_s
