"""Seed 000: prioritise prefills to keep compute saturated, mixing decodes into spare budget,
until KV usage nears a high watermark; then decodes go first and nothing is admitted until
usage falls below a low watermark (hysteresis, so it does not flap at the threshold)."""

from __future__ import annotations

from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.view import SchedulerView


class PrefillPriorityPolicy:
    name = "prefill-priority"
    help = "prefills first with decodes in spare budget; decodes first above a KV high watermark"
    knobs = ("token_budget", "max_num_seqs", "kv_high_watermark", "kv_low_watermark")

    def __init__(self) -> None:
        self.draining = False     # between crossing the high watermark and falling below the low one

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        if view.kv_usage >= knobs.kv_high_watermark:
            self.draining = True
        elif view.kv_usage <= knobs.kv_low_watermark or not view.running:
            self.draining = False
        step = StepBuilder(view, knobs)
        if self.draining:
            step.schedule_decodes()
            step.schedule_all(step.partial_prefills())
        else:
            step.schedule_all(step.partial_prefills())
            step.admit_in_order(view.waiting)
            step.schedule_decodes()
        return step.plan
