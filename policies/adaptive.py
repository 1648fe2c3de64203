"""The general tunable form the controller searches over.

Order within a step: prefill chunks (partial ones, then new requests) up to `prefill_priority`
of the budget, then every decode that fits, then prefills again in whatever budget is left. So 0
is Sarathi's decodes-first and 1 is prefills-first, with everything between reachable by one knob.
Admission keeps `kv_admission_watermark` of the pool free plus a reservation for the future
output tokens of running requests (`new_token_ratio`), caps concurrent partial prefills and the
chunk any one request gets (`long_prefill_token_threshold`), and orders the queue fcfs or spf.
"""

from __future__ import annotations

from policies.knobs import Knobs
from policies.kv_reserve import blocks_to_keep_free
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.view import SchedulerView, remaining_tokens


class AdaptivePolicy:
    name = "adaptive"
    help = "tunable: prefill share of the budget, chunk cap, partial-prefill limit, KV watermark, queue order"
    knobs = ("token_budget", "max_num_seqs", "prefill_priority", "max_partial_prefills",
             "long_prefill_token_threshold", "kv_admission_watermark", "new_token_ratio", "queue_order")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        decodes = step.decodes()
        prefill_share = round(knobs.prefill_priority * knobs.token_budget) if decodes else knobs.token_budget
        self._prefills(step, view, knobs, limit=prefill_share)
        step.schedule_all(decodes)
        self._prefills(step, view, knobs, limit=step.tokens_left)
        return step.plan

    def _prefills(self, step: StepBuilder, view: SchedulerView, knobs: Knobs, limit: int) -> None:
        stop_at = step.tokens_left - limit          # leave this much of the budget for later phases
        cap = knobs.long_prefill_token_threshold
        for seq in step.partial_prefills():
            room = step.tokens_left - stop_at
            if room <= 0:
                return
            step.schedule(seq, min(remaining_tokens(seq), room, cap or room))
        keep = blocks_to_keep_free(step, view, knobs.kv_admission_watermark, knobs.new_token_ratio)
        waiting = sorted(view.waiting, key=remaining_tokens) if knobs.queue_order == "spf" else view.waiting
        for seq in waiting:
            room = step.tokens_left - stop_at
            if room <= 0 or self._num_partial(step) >= knobs.max_partial_prefills:
                return
            if not step.admit(seq, min(remaining_tokens(seq), room, cap or room), keep):
                return

    @staticmethod
    def _num_partial(step: StepBuilder) -> int:
        admitted_partial = len(step.plan.admitted)
        return len(step.partial_prefills()) + admitted_partial
