"""What decides the fleet's size in a simulated day (cluster/fleet_run.py): the SLO planner, a
static fleet, or Ray Serve's default policy (cluster/ray_default_scaler.py). Each is told the
fleet's ongoing requests every tick and asked for a replica count every interval."""

from __future__ import annotations

from typing import Protocol

from cluster.fleet_telemetry import FleetTelemetry
from cluster.planner import PlanDecision, Planner


class Scaler(Protocol):
    interval_s: float
    initial_replicas: int

    def observe(self, now: float, ongoing: int) -> None: ...

    def decide(self, telemetry: FleetTelemetry, now: float) -> int: ...


class StaticScaler:
    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ValueError(f"a static fleet needs at least 1 replica, got {replicas}")
        self.initial_replicas = replicas
        self.interval_s = 3600.0

    def observe(self, now: float, ongoing: int) -> None:
        pass

    def decide(self, telemetry: FleetTelemetry, now: float) -> int:
        return self.initial_replicas


class PlannerScaler:
    def __init__(self, planner: Planner, initial_replicas: int | None = None) -> None:
        self.planner = planner
        self.interval_s = planner.config.interval_s
        self.initial_replicas = initial_replicas or planner.config.min_replicas
        planner.current = self.initial_replicas
        self.decisions: list[tuple[float, PlanDecision]] = []

    def observe(self, now: float, ongoing: int) -> None:
        pass

    def decide(self, telemetry: FleetTelemetry, now: float) -> int:
        decision = self.planner.decide(telemetry, now)
        self.decisions.append((now, decision))
        return decision.target
