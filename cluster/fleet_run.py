"""A simulated day of a fleet: requests arrive at the cluster's router (cluster/router.py: prefix
affinity within a load bound, as the live ingress), which sends each to a replica of the fleet
simulator (simulation/fleet.py); a scaler (the SLO planner, a static fleet, Ray Serve's default
policy) sets the replica count every interval. Scale-down drains: the leaving replica gets no new
request, the router forgets its prefixes, and it stops once what it holds has finished.

Measured: every request against its SLO class's targets, replica time (model loads and drains
included), and so goodput per replica-hour: requests within their SLO per replica-hour.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.fleet_scalers import Scaler
from cluster.fleet_telemetry import FleetTelemetry
from cluster.replica_telemetry import ReplicaTelemetry
from cluster.router import NoReplicaError, ReplicaLoad, Router, RouterConfig
from engine.kv_cache.block_manager import BLOCK_SIZE
from engine.outputs import RequestRecord
from loadgen.workload import RequestSpec
from simulation.fleet import Fleet, ReplicaEngine
from engine.slo_class import SloClass
from telemetry.window import meets_slo

TICK_S = 0.2                 # the ingress asks every replica for its load this often (RouterConfig.load_interval_s)
SAMPLE_S = 10.0              # the timeline's resolution


@dataclass(frozen=True)
class TimelinePoint:
    t: float
    rate_rps: float              # arrivals over the last SAMPLE_S
    serving: int
    starting: int
    draining: int


@dataclass
class DayResult:
    requests: int
    met: int
    by_class: dict[str, tuple[int, int]]     # class -> (requests, met)
    replica_seconds: float
    duration_s: float
    timeline: list[TimelinePoint] = field(default_factory=list)

    @property
    def attainment(self) -> float:
        return self.met / self.requests if self.requests else 1.0

    @property
    def replica_hours(self) -> float:
        return self.replica_seconds / 3600

    @property
    def goodput_per_replica_hour(self) -> float:
        return self.met / self.replica_hours if self.replica_seconds else 0.0

    def summary(self) -> dict:
        return {"requests": self.requests, "met": self.met, "attainment": self.attainment,
                "replica_hours": self.replica_hours, "goodput_per_replica_hour": self.goodput_per_replica_hour,
                "mean_replicas": self.replica_seconds / self.duration_s if self.duration_s else 0.0,
                "by_class": {k: {"requests": n, "attainment": m / n if n else 1.0} for k, (n, m) in self.by_class.items()}}


def prefix_keys(spec: RequestSpec, block_size: int) -> list[bytes]:
    """The router's keys of the spec's shared prefix blocks (its own tokens are never shared, so
    their keys would never match: left out)."""
    if spec.prefix_group is None:
        return []
    return [f"{spec.prefix_group}/{i}".encode() for i in range(spec.prefix_tokens // block_size)]


class DayRun:
    def __init__(self, make_simulator: Callable[[], ReplicaEngine], scaler: Scaler, startup_s: float,
                 router: RouterConfig = RouterConfig(), block_size: int = BLOCK_SIZE, initial_replicas: int | None = None) -> None:
        self.fleet = Fleet(make_simulator, startup_s)
        self.scaler, self.block_size = scaler, block_size
        self._names = (f"replica-{i}" for i in itertools.count())
        first = [next(self._names) for _ in range(initial_replicas or scaler.initial_replicas)]
        self.router = Router(first, router, block_size)
        for name in first:                 # warm at the start: the day begins in steady state
            self.fleet.add(name, 0.0, warm=True)
        self.backlog: list[RequestSpec] = []          # at the ingress while no replica takes requests
        self._interval = _Accumulator()
        self._finished_seen = 0
        self.timeline: list[TimelinePoint] = []

    # -- the fleet's size --
    def _add(self, now: float, warm: bool = False) -> None:
        name = next(self._names)
        self.fleet.add(name, now, warm)
        self.router.add_replica(name)

    def _scale_to(self, target: int, now: float) -> None:
        live = [r for r in self.fleet.live() if not r.draining]
        for _ in range(target - len(live)):
            self._add(now)
        if target >= len(live):
            return
        # leaving first: replicas still loading (nothing to lose), then the least loaded
        order = sorted(live, key=lambda r: (not r.starting(now), r.state(now).ongoing, -r.started_s))
        for replica in order[:len(live) - target]:
            self.router.remove_replica(replica.name)
            self.fleet.drain(replica.name, now)

    # -- one tick --
    def _poll_loads(self, now: float) -> int:
        ongoing = len(self.backlog)
        for replica in self.fleet.live():
            state = replica.state(now)
            ongoing += state.ongoing
            if not replica.draining:
                self.router.update(replica.name, ReplicaLoad(state.queued_tokens, state.running_tokens,
                                                             state.ready, replica.name))
        return ongoing

    def _route(self, spec: RequestSpec) -> bool:
        try:
            decision = self.router.choose(prefix_keys(spec, self.block_size), spec.prompt_tokens, spec.output_tokens)
        except NoReplicaError:
            return False
        self.fleet.submit(decision.replica, spec)
        self._interval.cached_tokens += decision.cached_tokens
        return True

    def run(self, specs: Sequence[RequestSpec], duration_s: float) -> DayResult:
        pending = iter(sorted(specs, key=lambda s: s.arrival_s))
        nxt = next(pending, None)
        now, next_plan, next_sample, recent, ticks = 0.0, self.scaler.interval_s, SAMPLE_S, 0, 0
        while now < duration_s or nxt is not None or self.backlog or any(not r.sim.done for r in self.fleet.live()):
            ticks += 1
            end = round(ticks * TICK_S, 9)          # counted, not summed: 25 ticks end at 5.0, not 5.000000000000001
            self.scaler.observe(now, self._poll_loads(now))
            self.backlog = [s for s in self.backlog if not self._route(s)]
            while nxt is not None and nxt.arrival_s < end:
                self._interval.arrive(nxt)
                recent += 1
                if self.backlog or not self._route(nxt):
                    self.backlog.append(nxt)
                nxt = next(pending, None)
            self.fleet.advance(end)
            now = end
            if now >= next_plan and now < duration_s:
                self._scale_to(self.scaler.decide(self._telemetry(now), now), now)
                next_plan += self.scaler.interval_s
            if now >= next_sample:
                self.timeline.append(self._point(now, recent / SAMPLE_S))
                next_sample, recent = next_sample + SAMPLE_S, 0
            if now >= duration_s and not self.fleet.live():
                break
        return self._result(now)

    def _telemetry(self, now: float) -> FleetTelemetry:
        new = self.fleet.finished[self._finished_seen:]
        self._finished_seen = len(self.fleet.finished)
        live = [r for r in self.fleet.live() if not r.draining]
        serving = [r for r in live if r.ready(now)]
        kv = sum(r.sim.kv_usage for r in serving) / len(serving) if serving else 0.0
        queued = sum(r.sim.load.queued_tokens for r in live) + sum(s.prompt_tokens + s.output_tokens for s in self.backlog)
        telemetry = self._interval.telemetry(self.scaler.interval_s, [rec for _, rec in new], kv,
                                             len(serving), len(live) - len(serving), queued)
        self._interval = _Accumulator()
        return telemetry

    def _point(self, now: float, rate: float) -> TimelinePoint:
        live = self.fleet.live()
        serving = sum(r.ready(now) for r in live)
        starting = sum(r.starting(now) for r in live)
        return TimelinePoint(now, rate, serving, starting, sum(r.draining for r in live))

    def _result(self, now: float) -> DayResult:
        slo = SloClass()
        by_class: dict[str, list[int]] = {}
        met = 0
        for _, record in self.fleet.finished:
            ok = meets_slo(record, slo)
            met += ok
            counts = by_class.setdefault(record.slo_class, [0, 0])
            counts[0] += 1
            counts[1] += ok
        rejected = self.fleet.rejected
        total = len(self.fleet.finished) + rejected
        return DayResult(total, met, {k: (n, m) for k, (n, m) in by_class.items()},
                         self.fleet.replica_seconds(now), now, self.timeline)


@dataclass
class _Accumulator:
    """One interval's arrivals, for the planner's telemetry."""

    arrivals: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def arrive(self, spec: RequestSpec) -> None:
        self.arrivals += 1
        self.prompt_tokens += spec.prompt_tokens
        self.output_tokens += spec.output_tokens

    def telemetry(self, interval_s: float, finished: list[RequestRecord], kv_usage: float, serving: int,
                  starting: int, queued_tokens: int) -> FleetTelemetry:
        return FleetTelemetry.of(interval_s, self.arrivals, self.prompt_tokens, self.output_tokens, self.cached_tokens,
                                 ReplicaTelemetry.of(finished, SloClass(), kv_usage), serving, starting, queued_tokens)


def run_day(specs: Sequence[RequestSpec], make_simulator: Callable[[], ReplicaEngine], scaler: Scaler,
            startup_s: float, duration_s: float, initial_replicas: int | None = None,
            router: RouterConfig = RouterConfig()) -> DayResult:
    return DayRun(make_simulator, scaler, startup_s, router, initial_replicas=initial_replicas).run(specs, duration_s)
