"""A fleet of simulated replicas: N single-engine simulators (simulation/simulator.py) of one
step-time model, or N queue models of it (cluster/queue_replica.py), each on its own virtual
clock, advanced together tick by tick.

A replica added at time t loads its model until t + startup_s and takes requests only after; a
draining one takes no new request, finishes what it holds, and stops when empty. Which replica a
request goes to is the caller's (the cluster's router, cluster/fleet_run.py): this module only
holds the replicas, their loads as a router sees them, and the records of what they served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from engine.outputs import RequestRecord
from simulation.simulator import EngineLoad, RequestLike


class ReplicaEngine(Protocol):
    """What the fleet drives of a replica: simulation.simulator.Simulator (the real scheduler step by
    step) or cluster.queue_replica.QueueReplica (a queue of work, for days of real length)."""

    now: float
    finish_listeners: list[Callable[[RequestRecord], None]]
    num_rejected: int

    def submit(self, items: Iterable[RequestLike]) -> None: ...

    def run_until(self, t_end: float) -> None: ...

    @property
    def done(self) -> bool: ...

    @property
    def load(self) -> EngineLoad: ...

    @property
    def kv_usage(self) -> float: ...


@dataclass(frozen=True)
class ReplicaState:
    """What a replica's telemetry says: the router's load and the autoscalers' counts."""

    name: str
    ready: bool                 # loaded and not draining: takes requests
    queued_tokens: int          # work left of waiting requests (prompt not computed + max_tokens left)
    running_tokens: int         # the same of running ones
    ongoing: int                # requests it holds (Ray Serve's "ongoing requests")
    kv_usage: float


@dataclass
class FleetReplica:
    name: str
    sim: ReplicaEngine
    started_s: float
    ready_s: float
    draining: bool = False
    stopped_s: float | None = None

    def ready(self, now: float) -> bool:
        return not self.draining and self.stopped_s is None and now >= self.ready_s

    def starting(self, now: float) -> bool:
        return not self.draining and self.stopped_s is None and now < self.ready_s

    def state(self, now: float) -> ReplicaState:
        load = self.sim.load
        return ReplicaState(self.name, self.ready(now), load.queued_tokens, load.running_tokens, load.ongoing,
                            self.sim.kv_usage)


@dataclass
class Fleet:
    make_simulator: Callable[[], ReplicaEngine]
    startup_s: float = 60.0
    replicas: dict[str, FleetReplica] = field(default_factory=dict)
    retired: list[FleetReplica] = field(default_factory=list)     # stopped, their name taken again
    finished: list[tuple[str, RequestRecord]] = field(default_factory=list)

    def add(self, name: str, now: float, warm: bool = False) -> FleetReplica:
        """A new replica, loading until now + startup_s (at once if `warm`)."""
        if name in self.replicas:
            if self.replicas[name].stopped_s is None:
                raise ValueError(f"replica {name} is already in the fleet")
            self.retired.append(self.replicas.pop(name))
        sim = self.make_simulator()
        sim.now = now
        sim.finish_listeners.append(lambda record, name=name: self.finished.append((name, record)))
        replica = FleetReplica(name, sim, now, now if warm else now + self.startup_s)
        self.replicas[name] = replica
        return replica

    def drain(self, name: str, now: float) -> None:
        """No new requests; it stops once what it holds has finished (a loading one stops now)."""
        replica = self.replicas[name]
        replica.draining = True
        if now < replica.ready_s or self._empty(replica):
            replica.stopped_s = now

    def submit(self, name: str, item: RequestLike) -> None:
        self.replicas[name].sim.submit([item])

    def advance(self, t_end: float) -> None:
        """Every live replica's clock to t_end; drained ones that ran empty stop."""
        for replica in self.live():
            if replica.ready_s < t_end:
                replica.sim.run_until(t_end)
            if replica.draining and self._empty(replica):
                replica.stopped_s = max(t_end, replica.sim.now)

    def live(self) -> list[FleetReplica]:
        return [r for r in self.replicas.values() if r.stopped_s is None]

    def all(self) -> list[FleetReplica]:
        return self.retired + list(self.replicas.values())

    @property
    def rejected(self) -> int:
        """Requests a replica could never hold (longer than its KV cache): the engine's 400."""
        return sum(r.sim.num_rejected for r in self.all())

    def replica_seconds(self, until: float) -> float:
        """GPU time held: from each replica's start (its model load included) to its stop."""
        return sum((r.stopped_s if r.stopped_s is not None else until) - r.started_s for r in self.all())

    @staticmethod
    def _empty(replica: FleetReplica) -> bool:
        return replica.sim.done
