"""The sizing rule (pure): replicas for a forecast load, from what one replica sustains, corrected
by how the fleet's observed latencies compare with the profile's at the same load (Dynamo's
throughput mode: its correction factors are observed TTFT and ITL over the profiled ones)."""

from __future__ import annotations

import math

from cluster.fleet_telemetry import FleetTelemetry
from cluster.planner_config import PlannerConfig
from cluster.replica_capacity import ReplicaCapacity

EPSILON = 1e-9       # 2.0000000001 replicas of work is 2, not 3


def latency_factors(telemetry: FleetTelemetry, capacity: ReplicaCapacity,
                    config: PlannerConfig) -> tuple[float, float]:
    """(prefill, decode) factors: observed mean TTFT / the profile's at the observed utilization
    per serving replica, and the same of TPOT, each within the config's bounds. 1.0 where the
    interval finished too few requests to say, nothing serves yet, or the utilization is beyond
    the profile's highest point: there latency is the queue of an overloaded fleet, which the load
    already asks replicas for; read as a slower replica it would shrink the capacity too and stack
    replicas on the same overload."""
    if telemetry.finished < config.min_samples or telemetry.serving < 1:
        return 1.0, 1.0
    per_replica = capacity.rate_for(telemetry.prompt_tokens, telemetry.output_tokens, telemetry.cached_fraction)
    utilization = telemetry.rate_rps / telemetry.serving / per_replica
    predicted = capacity.predicted(utilization)
    if predicted is None or utilization > capacity.latency[-1].utilization:
        return 1.0, 1.0
    return (_ratio(telemetry.ttft_s, predicted[0], config), _ratio(telemetry.tpot_s, predicted[1], config))


def _ratio(observed: float | None, predicted: float, config: PlannerConfig) -> float:
    if observed is None or not predicted > 0:
        return 1.0
    return min(max(observed / predicted, config.correction_min), config.correction_max)


def replicas_for(rate_rps: float, per_replica_rps: float, headroom: float) -> int:
    """Replicas whose capacity covers the rate with `headroom` to spare."""
    if rate_rps <= 0:
        return 0
    return math.ceil(rate_rps * (1 + headroom) / per_replica_rps - EPSILON)
