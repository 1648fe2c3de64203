"""The schedulers that came before Sarathi-Serve, as the seeds describe them."""

from __future__ import annotations

from policies.knobs import Knobs
from policies.plan import BatchPlan
from policies.step_builder import StepBuilder
from policies.view import SchedulerView


class PrefillFirstPolicy:
    name = "prefill-first"
    help = "vLLM v0: whole prefills first; decodes run only in steps where no waiting prefill fits"
    knobs = ("token_budget", "max_num_seqs")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        step.schedule_all(step.partial_prefills())       # prompts longer than the budget, cut at it
        step.admit_in_order(view.waiting, step.whole_prefill_size)
        if not step.plan.scheduled:
            step.schedule_decodes()
        return step.plan


class RequestLevelPolicy:
    name = "request-level"
    help = "FasterTransformer: a batch is admitted only when no request is running, then decoded to the end"
    knobs = ("token_budget", "max_num_seqs")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        if not view.running:
            step.admit_in_order(view.waiting, step.whole_prefill_size)
            return step.plan
        step.schedule_all(step.partial_prefills())
        if not step.plan.scheduled:
            step.schedule_decodes()
        return step.plan


class OrcaPolicy:
    name = "orca"
    help = "Orca: iteration-level batching, whole prefills mixed with all running decodes, no chunking"
    knobs = ("token_budget", "max_num_seqs")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        step.schedule_decodes()
        step.schedule_all(step.partial_prefills())
        step.admit_in_order(view.waiting, step.whole_prefill_size)
        return step.plan


class ChunkedAlternatingPolicy:
    name = "chunked-alternating"
    help = "simple chunking: prefill-chunk steps alternate with decode-only steps"
    knobs = ("token_budget", "max_num_seqs")

    def plan(self, view: SchedulerView, knobs: Knobs) -> BatchPlan:
        step = StepBuilder(view, knobs)
        phases = [self._prefills, self._decodes]
        if view.step % 2:
            phases.reverse()
        for phase in phases:          # the other phase runs only if this one has nothing to do
            phase(step, view)
            if step.plan.scheduled:
                break
        return step.plan

    @staticmethod
    def _prefills(step: StepBuilder, view: SchedulerView) -> None:
        step.schedule_all(step.partial_prefills())
        step.admit_in_order(view.waiting)

    @staticmethod
    def _decodes(step: StepBuilder, view: SchedulerView) -> None:
        step.schedule_decodes()
