"""The SLO planner's settings (the cluster config's `planner:` block, docs/cluster.md): replica
bounds, how often it plans, how it forecasts, how much headroom it keeps, and how long load must
stay low before it gives a replica back. Bad values raise ValueError with one line."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

FORECASTERS = ("last", "ewma", "holt")


@dataclass(frozen=True)
class PlannerConfig:
    min_replicas: int = 1
    max_replicas: int = 8
    interval_s: float = 30.0            # one plan per interval (Dynamo's adjustment_interval)
    forecaster: str = "holt"            # last | ewma | holt (level + trend, extrapolated over the horizon)
    alpha: float = 0.5                  # ewma/holt: weight of the newest interval's rate
    beta: float = 0.3                   # holt: weight of the newest change in level (the trend)
    headroom: float = 0.2               # spare capacity kept above the forecast load (0.2: 20%); below 0 the
                                        # fleet runs each replica past one replica's profiled capacity (it pools queues)
    scale_down_delay_s: float = 120.0   # load must want fewer replicas this long before one leaves
    backlog_drain_s: float = 60.0       # requests waiting for a first token are load to serve within this long
                                        # (a burst's queue sizes the scale-up, not only its arrival rate)
    startup_s: float = 60.0             # a new replica's start-up (model load): the forecast looks this far ahead
    slo_target: float = 0.99            # attainment below this in an interval adds a replica
    correction_min: float = 0.5         # bounds of the observed/predicted latency factors
    correction_max: float = 2.0
    min_samples: int = 20               # finished requests an interval needs before its latencies count
    replica_capacity_rps: float | None = None   # live: one replica's measured capacity (`autotuned-serve capacity`)

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"planner: need 1 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                             f"{self.max_replicas}")
        if not self.interval_s > 0:
            raise ValueError(f"planner: interval_s must be > 0, got {self.interval_s}")
        if self.forecaster not in FORECASTERS:
            raise ValueError(f"planner: forecaster must be one of {', '.join(FORECASTERS)}, got {self.forecaster!r}")
        if not (0 < self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError(f"planner: need 0 < alpha <= 1 and 0 <= beta <= 1, got {self.alpha} and {self.beta}")
        if not self.headroom > -1:
            raise ValueError(f"planner: headroom must be > -1, got {self.headroom}")
        if self.scale_down_delay_s < 0 or self.startup_s < 0:
            raise ValueError("planner: scale_down_delay_s and startup_s must be >= 0")
        if not self.backlog_drain_s > 0:
            raise ValueError(f"planner: backlog_drain_s must be > 0, got {self.backlog_drain_s}")
        if not 0 < self.slo_target <= 1:
            raise ValueError(f"planner: slo_target must be in (0, 1], got {self.slo_target}")
        if not 0 < self.correction_min <= 1 <= self.correction_max:
            raise ValueError(f"planner: need 0 < correction_min <= 1 <= correction_max, got "
                             f"{self.correction_min} and {self.correction_max}")
        if self.min_samples < 1:
            raise ValueError(f"planner: min_samples must be >= 1, got {self.min_samples}")
        if self.replica_capacity_rps is not None and not self.replica_capacity_rps > 0:
            raise ValueError(f"planner: replica_capacity_rps must be > 0, got {self.replica_capacity_rps}")

    @property
    def horizon_intervals(self) -> float:
        """How many intervals ahead the load must be covered: a replica asked for now serves after
        its start-up, and until the next plan."""
        return (self.startup_s + self.interval_s) / self.interval_s

    @staticmethod
    def from_dict(values: dict[str, Any]) -> PlannerConfig:
        known = {f.name for f in dataclasses.fields(PlannerConfig)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"planner: unknown field {sorted(unknown)[0]!r} (known: {', '.join(sorted(known))})")
        return PlannerConfig(**values)
