"""Policies by name: each is a pure planner of (scheduler view, knobs) -> batch plan."""

from __future__ import annotations

from typing import Protocol

from policies.adaptive import AdaptivePolicy
from policies.classic import ChunkedAlternatingPolicy, OrcaPolicy, PrefillFirstPolicy, RequestLevelPolicy
from policies.deadline import DeadlinePolicy
from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.prefill_priority import PrefillPriorityPolicy
from policies.sarathi import SarathiPolicy
from policies.view import SchedulerView


class Policy(Protocol):
    name: str
    help: str
    knobs: tuple[str, ...]      # the knobs this policy reads

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan: ...


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (
    PrefillFirstPolicy, RequestLevelPolicy, OrcaPolicy, ChunkedAlternatingPolicy, SarathiPolicy,
    PrefillPriorityPolicy, AdaptivePolicy, DeadlinePolicy)}


DEFAULT_POLICY = "deadline"   # what the daemon, the engine, the simulator and every command run unless told


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICIES)}")
    return POLICIES[name]()
