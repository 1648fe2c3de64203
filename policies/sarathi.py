"""Sarathi-Serve's stall-free batching: every running decode first, then the partial prefills,
then new requests, all under one token budget (chunked prefill fills what decodes leave)."""

from __future__ import annotations

from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.view import SchedulerView


class SarathiPolicy:
    name = "sarathi"
    help = "stall-free: decodes first, then partial prefills, then new requests, chunked under the token budget"
    knobs = ("token_budget", "max_num_seqs")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        step.schedule_decodes()
        step.schedule_all(step.partial_prefills())
        step.admit_in_order(view.waiting)
        return step.plan
