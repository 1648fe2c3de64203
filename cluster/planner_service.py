"""The SLO planner on a live cluster, run by the ingress (it sees every request and holds a
handle to every replica): each interval it adds up the interval's arrivals and the replicas'
telemetry, asks the planner (cluster/planner.py) for a count, and enacts it through Ray Serve's
external scaler API (cluster/serve_scaling.py), one single-replica deployment at a time.

Scale-up: the next deployment at 0 is set to 1; Serve starts it, and the router takes it in once
its load answers healthy (model loaded). Scale-down: the leaving replica (fewest requests in
flight) leaves the router at once (no new request; its prefixes leave the index), finishes what
it holds, and is set to 0 only when the ingress has no request in flight on it, so Serve stops an
idle replica. Requests it answered 503 (loading, draining) were already sent elsewhere.

Demand is counted at routing, once per request: a request one replica shed (429) and the ingress
sent on is one arrival however many replicas it tried. Each replica also books a request it shed
as finished and missed; the fleet's outcome is the request's last answer only, so the sheds that
were followed by another try come off the replicas' finished count: a request every replica shed
is one miss, and one of the interval's `shed`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

from cluster.fleet_telemetry import FleetTelemetry
from cluster.planner import PlanDecision, Planner
from cluster.planner_config import PlannerConfig
from cluster.replica_capacity import ReplicaCapacity
from cluster.replica_telemetry import ReplicaTelemetry
from cluster.router import Router

log = logging.getLogger(__name__)
Scale = Callable[[str, int], Awaitable[None]]                       # deployment, replicas
AskTelemetry = Callable[[list[str], float], Awaitable[list[ReplicaTelemetry]]]


class PlannerService:
    def __init__(self, config: PlannerConfig, names: Sequence[str], active: Sequence[str], router: Router,
                 scale: Scale) -> None:
        self.config, self.names, self.router, self.scale = config, list(names), router, scale
        self.planner = Planner(config, ReplicaCapacity.measured(config.replica_capacity_rps or 1.0))
        self.planner.current = len(active)
        self.active: list[str] = list(active)          # deployments at 1 replica, not leaving
        self.draining: list[str] = []                  # leaving: at 1 until nothing is in flight
        self.inflight: Counter[str] = Counter()
        self.last: PlanDecision | None = None
        self._arrivals = self._prompt = self._output = self._cached = 0
        self._sheds = self._overloaded = 0

    # -- what the ingress tells it --
    def on_routed(self, prompt_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        self._arrivals += 1
        self._prompt += prompt_tokens
        self._output += output_tokens
        self._cached += cached_tokens

    def on_shed(self) -> None:
        """A replica shed a routed request (429 with Retry-After)."""
        self._sheds += 1

    def on_overloaded(self) -> None:
        """Every replica the ingress could try shed a request: it answered 429."""
        self._overloaded += 1

    def sent(self, replica: str) -> None:
        self.inflight[replica] += 1

    def done(self, replica: str) -> None:
        self.inflight[replica] -= 1

    # -- every interval --
    async def run(self, ask: AskTelemetry) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            try:
                await self.step(ask)
            except Exception:
                log.exception("the planner's interval failed; serving goes on at %d replicas", len(self.active))

    async def step(self, ask: AskTelemetry) -> PlanDecision:
        answers = await ask(self.active, self.config.interval_s)
        self.last = decision = self.planner.decide(self.telemetry(ReplicaTelemetry.total(answers)), time.monotonic())
        await self.scale_to(decision.target)
        await self.retire_drained()
        return decision

    def telemetry(self, replicas: ReplicaTelemetry) -> FleetTelemetry:
        loads = [self.router.loads[r] for r in self.active if r in self.router.loads]
        serving = sum(load.healthy for load in loads)
        telemetry = FleetTelemetry.of(self.config.interval_s, self._arrivals, self._prompt, self._output, self._cached,
                                      last_answers(replicas, self._sheds - self._overloaded), serving,
                                      len(self.active) - serving, sum(load.queued_tokens for load in loads),
                                      self._overloaded)
        self._arrivals = self._prompt = self._output = self._cached = 0
        self._sheds = self._overloaded = 0
        return telemetry

    async def scale_to(self, target: int) -> None:
        while len(self.active) < target:
            name = self._next_free()
            if name in self.draining:          # wanted again before it left: it stays, warm
                self.draining.remove(name)
            else:
                await self.scale(name, 1)
            self.active.append(name)
            self.router.add_replica(name)
            log.info("planner: %s joins (%d replicas)", name, len(self.active))
        while len(self.active) > max(target, 1):
            name = min(reversed(self.active), key=lambda r: self.inflight[r])
            self.active.remove(name)
            self.router.remove_replica(name)
            self.draining.append(name)
            log.info("planner: %s leaves once its %d requests finish (%d replicas)", name, self.inflight[name],
                     len(self.active))

    async def retire_drained(self) -> None:
        for name in [r for r in self.draining if self.inflight[r] <= 0]:
            await self.scale(name, 0)
            self.draining.remove(name)

    def _next_free(self) -> str:
        free = [r for r in self.names if r not in self.active and r not in self.draining]
        return free[0] if free else self.draining[-1]

    def status(self) -> dict:
        d = self.last
        return {"active": self.active, "draining": self.draining, "inflight": dict(self.inflight),
                "last": None if d is None else {"target": d.target, "wanted": d.wanted, "reason": d.reason,
                                                "forecast_rps": d.forecast_rps, "backlog_rps": d.backlog_rps,
                                                "per_replica_rps": d.per_replica_rps}}


def last_answers(replicas: ReplicaTelemetry, sent_on: int) -> ReplicaTelemetry:
    """The replicas' books less the `sent_on` sheds another replica then answered (or shed again):
    each is booked finished and missed where it was shed (a shed never meets its SLO, so `met` stays)."""
    return replace(replicas, finished=max(replicas.met, replicas.finished - sent_on))
