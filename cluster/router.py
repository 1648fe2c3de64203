"""Which replica serves a request (pure: no Ray, unit-tested alone).

A request costs a replica the tokens it must compute: its prompt, less the prefix the replica
already caches, and its output. Each healthy replica is scored

    load (tokens of work left, queued + running, from its telemetry, plus what was sent since)
    + prompt tokens - the prompt tokens it probably caches (PrefixIndex)

and the cheapest wins (ties: in turn, so equal replicas share the work). So a long shared prefix
(a system prompt, a conversation's history) pulls its requests to where it is cached until that
replica is busier by more than the prefix is worth; then a second replica computes it once and
the two share the prefix's traffic by load. Following a prefix is never allowed to pick a replica
more than `max_imbalance_tokens` busier than the least loaded one (SGLang's router bounds its
cache-aware choice the same way). Unhealthy replicas (load not answered, a failed call) are left
out until their telemetry answers again; a replica whose incarnation changed (Serve restarted
it) starts with an empty cache, so the index forgets it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.prefix_index import PrefixIndex
from engine.kv_cache.block_manager import BLOCK_SIZE

POLICIES = ("affinity", "load", "round_robin")


class NoReplicaError(RuntimeError):
    """No healthy replica is left to try."""


@dataclass(frozen=True)
class ReplicaLoad:
    """What a replica's telemetry says, as of its last answer."""

    queued_tokens: int = 0
    running_tokens: int = 0
    healthy: bool = True           # loaded, not draining
    incarnation: str = ""          # new whenever the replica process starts

    @property
    def tokens(self) -> int:
        return self.queued_tokens + self.running_tokens


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "affinity"             # affinity | load (least loaded) | round_robin
    max_imbalance_tokens: int = 4096     # beyond this over the least loaded replica, affinity yields to load
    index_capacity: int = 200_000        # block keys the prefix index remembers
    load_interval_s: float = 0.2         # how often the ingress asks every replica for its load
    load_timeout_s: float = 2.0          # a replica silent this long is unhealthy

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_imbalance_tokens < 0 or self.index_capacity < 1:
            raise ValueError("router: max_imbalance_tokens must be >= 0 and index_capacity >= 1")
        if not (self.load_interval_s > 0 and self.load_timeout_s > 0):
            raise ValueError("router: load_interval_s and load_timeout_s must be > 0")


@dataclass(frozen=True)
class Decision:
    replica: str
    reason: str              # affinity | load | round_robin | balance (affinity overridden by imbalance)
    cached_tokens: int       # prompt tokens the replica probably caches
    load_tokens: int         # its load when chosen


class Router:
    def __init__(self, replicas: Sequence[str], config: RouterConfig = RouterConfig(), block_size: int = BLOCK_SIZE) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = list(replicas)
        self.config, self.block_size = config, block_size
        self.index = PrefixIndex(config.index_capacity)
        self.loads: dict[str, ReplicaLoad] = {r: ReplicaLoad(healthy=False) for r in self.replicas}
        self.sent_tokens: dict[str, int] = dict.fromkeys(self.replicas, 0)   # routed since the last load answer
        self._turn = itertools.count()

    # -- which replicas there are (the planner adds and removes them) --
    def add_replica(self, replica: str) -> None:
        """A replica that joins (scale-up): routed to once its load answers healthy."""
        if replica not in self.loads:
            self.replicas.append(replica)
            self.loads[replica] = ReplicaLoad(healthy=False)
            self.sent_tokens[replica] = 0

    def remove_replica(self, replica: str) -> None:
        """A replica that leaves (scale-down): no new request goes to it, and the index forgets
        its prefixes, so no request is pulled towards a cache that is going away. What it is
        serving is the caller's to finish (the ingress waits for its in-flight requests)."""
        if replica in self.loads:
            self.replicas.remove(replica)
            del self.loads[replica], self.sent_tokens[replica]
            self.index.forget(replica)

    # -- what the replicas say --
    def update(self, replica: str, load: ReplicaLoad) -> None:
        if replica not in self.loads:       # removed while its answer was on the way
            return
        if load.incarnation != self.loads[replica].incarnation:
            self.index.forget(replica)
        self.loads[replica] = load
        self.sent_tokens[replica] = 0

    def mark_unhealthy(self, replica: str) -> None:
        if replica not in self.loads:
            return
        old = self.loads[replica]
        self.loads[replica] = ReplicaLoad(old.queued_tokens, old.running_tokens, False, old.incarnation)

    def healthy(self, exclude: Iterable[str] = ()) -> list[str]:
        excluded = set(exclude)
        return [r for r in self.replicas if self.loads[r].healthy and r not in excluded]

    def load_tokens(self, replica: str) -> int:
        return self.loads[replica].tokens + self.sent_tokens[replica]

    # -- choosing --
    def choose(self, keys: Sequence[bytes], prompt_tokens: int, output_tokens: int = 0,
               exclude: Iterable[str] = ()) -> Decision:
        """The replica for a prompt with these block keys; records the choice (the replica's load
        grows by the work sent, the index learns the keys)."""
        candidates = self._rotated(self.healthy(exclude))
        if not candidates:
            raise NoReplicaError("no healthy replica")
        decision = self._pick(candidates, keys, prompt_tokens)
        self.sent_tokens[decision.replica] += prompt_tokens - decision.cached_tokens + output_tokens
        if keys:
            self.index.insert(decision.replica, keys)
        return decision

    def _rotated(self, candidates: list[str]) -> list[str]:
        if not candidates:
            return candidates
        start = next(self._turn) % len(candidates)
        return candidates[start:] + candidates[:start]

    def _pick(self, candidates: list[str], keys: Sequence[bytes], prompt_tokens: int) -> Decision:
        load = {r: self.load_tokens(r) for r in candidates}
        if self.config.policy == "round_robin":
            return Decision(candidates[0], "round_robin", 0, load[candidates[0]])
        least = min(candidates, key=load.__getitem__)     # first of the rotation among equals
        if self.config.policy == "load":
            return Decision(least, "load", 0, load[least])
        matched = self.index.matched_blocks(keys)
        usable = max(0, prompt_tokens - 1) // self.block_size   # as the engine: the last token is always computed
        cached = {r: min(matched.get(r, 0), usable) * self.block_size for r in candidates}
        best = min(candidates, key=lambda r: load[r] - cached[r])
        if load[best] - load[least] > self.config.max_imbalance_tokens:
            return Decision(least, "balance", cached[least], load[least])
        return Decision(best, "affinity" if cached[best] else "load", cached[best], load[best])
