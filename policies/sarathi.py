"""Sarathi-Serve's stall-free batching: every running decode first, then the partial prefills,
then new requests, all under one token budget (chunked prefill fills what decodes leave)."""

from __future__ import annotations

from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.view import SchedulerView, is_decode, remaining_tokens


class SarathiPolicy:
    name = "sarathi"
    help = "stall-free: decodes first, then partial prefills, then new requests, under the token budget"

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        for seq in list(step.running):
            if is_decode(seq) and step.is_running(seq):
                step.schedule(seq, 1)
        for seq in list(step.running):
            if not is_decode(seq) and step.is_running(seq) and step.tokens_left > 0:
                step.schedule(seq, remaining_tokens(seq))
        step.admit_in_order(view.waiting)
        return step.plan
