"""Which replica serves a request (pure: no Ray, unit-tested alone).

A replica that caches a prompt's prefix skips computing it, so a request goes to the healthy
replica holding the longest prefix of its prompt (PrefixIndex; among equals the least loaded; a
match under `min_match_fraction` of the prompt, like a chat template's fixed opening, is ignored),
unless that replica's load (queued + running tokens from its telemetry, plus what was sent to it
since) is more than `max_imbalance_tokens` above the least loaded one's: then load wins, so a hot
prefix cannot pile every request on one replica (SGLang's cache-aware router does the same). A
prompt no replica caches goes to the least loaded one; ties go round in turn. Unhealthy replicas
(load not answered, a failed call) are left out until their telemetry answers again; a replica
whose incarnation changed (Serve restarted it) starts with an empty cache, so the index forgets it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cluster.prefix_index import PrefixIndex

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
    min_match_fraction: float = 0.5      # a prefix shorter than this share of the prompt (a chat template's
                                         # fixed opening, say) is not worth following: load decides
    index_capacity: int = 200_000        # block keys the prefix index remembers
    load_interval_s: float = 0.2         # how often the ingress asks every replica for its load
    load_timeout_s: float = 2.0          # a replica silent this long is unhealthy

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.max_imbalance_tokens < 0 or self.index_capacity < 1 or not 0 <= self.min_match_fraction <= 1:
            raise ValueError("router: max_imbalance_tokens must be >= 0, index_capacity >= 1 and "
                             "min_match_fraction in [0, 1]")
        if not (self.load_interval_s > 0 and self.load_timeout_s > 0):
            raise ValueError("router: load_interval_s and load_timeout_s must be > 0")


@dataclass(frozen=True)
class Decision:
    replica: str
    reason: str              # affinity | load | round_robin | balance (affinity overridden by imbalance)
    cached_tokens: int       # prompt tokens the replica probably caches
    load_tokens: int         # its load when chosen


class Router:
    def __init__(self, replicas: Sequence[str], config: RouterConfig = RouterConfig(), block_size: int = 16) -> None:
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = list(replicas)
        self.config, self.block_size = config, block_size
        self.index = PrefixIndex(config.index_capacity)
        self.loads: dict[str, ReplicaLoad] = {r: ReplicaLoad(healthy=False) for r in self.replicas}
        self.sent_tokens: dict[str, int] = dict.fromkeys(self.replicas, 0)   # routed since the last load answer
        self._turn = itertools.count()

    # -- what the replicas say --
    def update(self, replica: str, load: ReplicaLoad) -> None:
        if load.incarnation != self.loads[replica].incarnation:
            self.index.forget(replica)
        self.loads[replica] = load
        self.sent_tokens[replica] = 0

    def mark_unhealthy(self, replica: str) -> None:
        old = self.loads[replica]
        self.loads[replica] = ReplicaLoad(old.queued_tokens, old.running_tokens, False, old.incarnation)

    def healthy(self, exclude: Iterable[str] = ()) -> list[str]:
        excluded = set(exclude)
        return [r for r in self.replicas if self.loads[r].healthy and r not in excluded]

    def load_tokens(self, replica: str) -> int:
        return self.loads[replica].tokens + self.sent_tokens[replica]

    # -- choosing --
    def choose(self, keys: Sequence[bytes], cost_tokens: int, exclude: Iterable[str] = ()) -> Decision:
        """The replica for a prompt with these block keys, costing about `cost_tokens`; records the
        choice (its load grows by the cost, its index learns the keys)."""
        candidates = self._rotated(self.healthy(exclude))
        if not candidates:
            raise NoReplicaError("no healthy replica")
        decision = self._pick(candidates, keys, cost_tokens)
        self.sent_tokens[decision.replica] += cost_tokens
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
        enough = self.config.min_match_fraction * prompt_tokens
        cached = {r: n * self.block_size for r, n in self.index.matched_blocks(keys).items()
                  if r in load and n * self.block_size >= enough}
        if not cached:
            return Decision(least, "load", 0, load[least])
        best = max(cached, key=lambda r: (cached[r], -load[r]))
        if load[best] - load[least] > self.config.max_imbalance_tokens:
            return Decision(least, "balance", cached.get(least, 0), load[least])
        return Decision(best, "affinity", cached[best], load[best])
