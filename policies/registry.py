"""Policies by name."""

from __future__ import annotations

from typing import Protocol

from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.sarathi import SarathiPolicy
from policies.view import SchedulerView


class Policy(Protocol):
    name: str
    help: str

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan: ...


POLICIES: dict[str, type[Policy]] = {cls.name: cls for cls in (SarathiPolicy,)}


def get_policy(name: str) -> Policy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICIES)}")
    return POLICIES[name]()
