"""A discrete-event run of the real scheduler, policies and KV block manager, with a cost model in
place of the forward pass.

Each step asks the same Scheduler (and so the same policy code) for a plan, advances a virtual
clock by the cost model's prediction for that step's shape, and emits the same StepRecords and
RequestRecords as the real engine, so telemetry windows, client metrics and the controller see a
simulated run exactly as they see a live one. Requests generate exactly their `output_tokens`
(like a benchmark client sending ignore_eos).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from engine.kv_cache.block_manager import BLOCK_SIZE, BlockManager
from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
from simulation.cost_model import CostModel
from simulation.speculation_model import SimulatedDrafter, SpeculationModel
from engine.speculation.speculator import Speculator
from simulation.step_scatter import DEADLINE_QUANTILE, StepScatter, factor_at
from engine.llm_engine import request_record, step_record
from engine.model_runner import StepTiming
from engine.outputs import DraftStep, GrammarStep, RequestRecord, StepRecord
from engine.scheduling.request import FinishReason, Request
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduleResult, Scheduler
from engine.slo_class import SloClasses, shipped_slo_classes
from policies import DEFAULT_POLICY, Knobs
from policies.step_shape import attended_pairs, context_tokens

IDLE_TICK_S = 0.001   # how far the clock moves when a policy schedules nothing while work waits


class SimulatedGrammar:
    """A simulated request's stand-in grammar: the scheduler and the cost model ask whether there is one,
    the speculator whether it takes a draft (every one)."""

    def accept(self, token: int) -> bool:
        return True

    def rollback(self, num_tokens: int) -> None:
        pass


SIMULATED_GRAMMAR = SimulatedGrammar()


class RequestLike(Protocol):
    """What the simulator reads of a workload item (loadgen.workload.RequestSpec has it)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_class: str | None
    # optional (loadgen.workload.RequestSpec has them): the prompt's first prefix_tokens are its group's
    prefix_group: str | None
    prefix_tokens: int
    constrained: bool            # held to a grammar: each of its sampled rows costs cost.grammar_row_s


@dataclass(frozen=True)
class EngineLoad:
    """What a router and an autoscaler read of a replica (simulation/fleet.py)."""

    queued_tokens: int       # work left of waiting requests: prompt not computed + output not generated
    running_tokens: int      # the same of running ones
    ongoing: int             # requests held (waiting + running + routed, not yet arrived)


class Simulator:
    def __init__(self, cost: CostModel, num_blocks: int, block_size: int = BLOCK_SIZE, policy: str = DEFAULT_POLICY,
                 knobs: Knobs | None = None, coast: bool = True, slo_classes: SloClasses | None = None,
                 prefix_caching: bool = True, speculation: SpeculationModel | None = None) -> None:
        self.cost = cost
        self.slo_classes = slo_classes or shipped_slo_classes()
        # a cost model of an engine with sliding-window layers (CostModel.kv_groups, step_shape): the same pool of
        # pages per layer group and step shapes, and decode stretches run step by step (coasting assumes every
        # layer reads one more key and holds one more block per token)
        groups = cost.kv_groups() if isinstance(cost, CostModel) else None
        shape = cost.step_shape() if isinstance(cost, CostModel) else None
        # a model that carries the live scatter of step times: each step takes its prediction times a draw
        self.scatter = StepScatter(cost.step_scatter) if cost.step_scatter else None
        # replay pure-decode stretches without asking the policy (same result, faster)
        self.coast = coast and groups is None and shape is None
        self.now = 0.0
        self.blocks = (PrefixCachingBlockManager if prefix_caching else BlockManager)(num_blocks, block_size, groups)
        self.scheduler = Scheduler(self.blocks, policy, knobs, clock=lambda: self.now, shape=shape)
        # the deadline policy prices steps with the model that times them; under scatter at the percentile the
        # live scheduler prices at (simulation.live_cost_model), so some slack-filled steps overrun, as live
        self.scheduler.cost = cost.scaled(factor_at(cost.step_scatter, DEADLINE_QUANTILE)) if self.scatter else cost
        self.scheduler.arrival_guard_s = self.slo_classes.arrival_guard_s()
        # speculative decoding (simulation/speculation_model.py): the real speculator over a stand-in drafter
        self.drafter = SimulatedDrafter(speculation) if speculation is not None else None
        if self.drafter is not None:
            self.scheduler.speculator = Speculator(self.drafter)
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.finish_listeners: list[Callable[[RequestRecord], None]] = []
        self.arrival_listeners: list[Callable[[Request], None]] = []
        self.num_steps = 0
        self.num_rejected = 0
        self.num_shed = 0
        self.shed_retry_after: list[tuple[Request, float]] = []   # each refusal at arrival, with its Retry-After
        self._pending: deque[RequestLike] = deque()
        self._ids = 0
        self._groups: dict[str, int] = {}

    # -- workload --
    def submit(self, items: Iterable[RequestLike]) -> None:
        """Queue future arrivals (in arrival order, after any already queued)."""
        self._pending.extend(sorted(items, key=lambda r: r.arrival_s))

    @property
    def done(self) -> bool:
        return not self._pending and not self.scheduler.has_work()

    @property
    def load(self) -> EngineLoad:
        scheduler = self.scheduler
        queued = sum(map(_work_left, scheduler.waiting)) + sum(p.prompt_tokens + p.output_tokens for p in self._pending)
        return EngineLoad(queued, sum(map(_work_left, scheduler.running)),
                          len(scheduler.waiting) + len(scheduler.running) + len(self._pending))

    @property
    def kv_usage(self) -> float:
        return self.blocks.usage

    def _arrive(self, item: RequestLike) -> None:
        params = SamplingParams(max_tokens=item.output_tokens, ignore_eos=True)
        group = getattr(item, "prefix_group", None)
        request = Request(f"sim-{self._ids}", self._prompt(item, group), params, item.arrival_s,
                          slo=self.slo_classes.get(getattr(item, "slo_class", None)), cacheable=group is not None,
                          grammar=SIMULATED_GRAMMAR if getattr(item, "constrained", False) else None)
        self._ids += 1
        for listener in self.arrival_listeners:
            listener(request)
        if self.blocks.blocks_for(item.prompt_tokens + item.output_tokens) > self.blocks.num_blocks:
            self.num_rejected += 1     # the engine answers such a request with a 400
            return
        decision = self.scheduler.admission.decide(request, self.scheduler, self.now)
        if not decision.admitted:
            self.shed_retry_after.append((request, decision.retry_after_s))
            request.finish_reason = FinishReason.SHED
            request.timings.finished = self.now
            self._end_shed(request)
            return
        self.scheduler.add(request)

    def _end_shed(self, request: Request) -> None:
        """Refused at arrival or ended in the queue by admission: a finished request that met no SLO."""
        self.num_shed += 1
        record = request_record(request)
        for listener in self.finish_listeners:
            listener(record)

    def _prompt(self, item: RequestLike, group: str | None) -> list[int]:
        """Token ids only the prefix cache reads: a request of a prefix group starts with its group's
        ids, then ids no other request has. Without a group the ids are never read: a range has the
        right length and costs nothing (and the request is not cacheable)."""
        n = item.prompt_tokens
        if group is None:
            return range(n)  # type: ignore[return-value]
        gid = self._groups.setdefault(group, len(self._groups) + 1)
        shared = min(n, item.prefix_tokens)
        own = -(self._ids + 1) << 24         # negative: never a group's; lengths stay below 2^24
        return list(range(gid << 24, (gid << 24) + shared)) + list(range(own, own + n - shared))

    # -- time --
    def run_until(self, t_end: float) -> None:
        """Advance the virtual clock to `t_end` (a step that starts before it may end after it)."""
        while self.now < t_end:
            self._advance(t_end)

    def run(self) -> None:
        """Until every submitted request has finished."""
        while not self.done:
            self._advance(float("inf"))

    def _advance(self, t_end: float) -> None:
        """Admit the arrivals due by now, then run one step, or jump to the next arrival."""
        while self._pending and self._pending[0].arrival_s <= self.now:
            self._arrive(self._pending.popleft())
        if self.scheduler.has_work():
            self.step(t_end)
        else:
            self.now = min(t_end, self._pending[0].arrival_s) if self._pending else t_end

    def step(self, t_end: float = float("inf")) -> None:
        start = self.now
        for request in self.scheduler.admission.expired(self.scheduler, self.now):
            self.scheduler.finish(request, FinishReason.SHED)
            self._end_shed(request)
        result = self.scheduler.schedule()
        if not result.scheduled:
            self.now += IDLE_TICK_S
            return
        decodes = result.num_decode_tokens      # StepShape.of_schedule(result), without the object
        masks_s = getattr(self.cost, "grammar_row_s", 0.0) * result.num_grammar_rows
        counts = (result.num_tokens - decodes, decodes, result.num_sampled, result.context_tokens,
                  result.attended_pairs, result.num_rows or len(result.scheduled))
        duration = (self.cost.predict_with_drafts(*counts, result.num_draft_tokens)
                    if result.num_draft_tokens and hasattr(self.cost, "predict_with_drafts")
                    else self.cost.predict_counts(*counts)) + masks_s
        if self.scatter:
            duration *= self.scatter.factor()
        self.now += duration
        kept = {s.request.request_id: self.drafter.kept(s.request.request_id, s.num_drafts)
                for s in result.scheduled if s.num_drafts} \
            if result.num_draft_tokens else {}
        self.scheduler.commit(result, kept)
        if self.drafter is not None:
            for request_id, _ in self.scheduler.speculator.untested(result.scheduled):
                self.scheduler.speculator.observe(request_id, 1, self.drafter.kept(request_id, 1), result.knobs)
        gaps: list[float] | None = [] if self.step_listeners else None
        num_sampled, num_finished = self._emit_tokens(result, gaps, kept)
        record = None
        if self.step_listeners:           # a record only for someone who reads it
            record = step_record(self.num_steps, result, self.scheduler, num_sampled, start, duration, 0.0,
                                 StepTiming(0.0, duration, 0.0, masks_s), tuple(gaps),
                                 GrammarStep(result.num_grammar_rows, masks_s),
                                 DraftStep(result.num_draft_tokens, sum(kept.values()), len(kept)))
        self.num_steps += 1
        for listener in self.step_listeners:
            listener(record)
        if self.coast and self._steady(result, num_finished):
            self._coast(record, t_end)

    def _steady(self, result: ScheduleResult, num_finished: int) -> bool:
        """The step was all decodes, of every request running before it, and nothing waits: until an
        arrival, a knob change or a KV block the pool cannot give, every policy plans the all-decode
        step of the requests still running again."""
        s = self.scheduler
        return (not s.waiting and not result.num_preempted and not s.has_pending_change
                and result.num_decode_tokens == len(result.scheduled) == len(s.running) + num_finished)

    def _coast(self, record: StepRecord | None, t_end: float) -> None:
        """Replays those all-decode steps without asking the policy: each sequence gains a token and
        its KV slot, and those at max_tokens finish, as step() would do them. The steps' tokens reach
        the requests in one go, before a finish and at the end (listeners read records, not requests)."""
        scheduler, running = self.scheduler, self.scheduler.running
        stop_at = min(self._pending[0].arrival_s if self._pending else float("inf"), t_end)
        fields = vars(record) if record is not None else {}
        budget, block_size = scheduler.error_budget, self.blocks.block_size
        pending: list[float] = []   # end times of the steps whose tokens the requests have not got yet
        steps_to_finish = step = 0  # steps until some sequence reaches max_tokens; steps coasted
        while running and self.now < stop_at and not scheduler.has_pending_change:
            if steps_to_finish == 0:     # the batch is new: sum what its steps depend on
                batch = len(running)
                context = sum(context_tokens(1, r.num_computed_tokens) for r in running)   # the next step's
                pairs = sum(attended_pairs(1, r.num_computed_tokens) for r in running)
                tolerated = sum(r.tbt_tolerance for r in running)
                tightest_tbt = min(r.tbt_target_s for r in running)
                constrained = sum(r.grammar is not None for r in running)
                masks_s = getattr(self.cost, "grammar_row_s", 0.0) * constrained
                steps_to_finish = min(r.max_tokens - len(r.output_token_ids) for r in running)
                by_slot = self._by_block_boundary(running, step)
            if not self._grow_for_next_token(by_slot[step % block_size], len(pending)):
                break
            step += 1
            steps_to_finish -= 1
            start = self.now
            duration = self.cost.predict_counts(0, batch, batch, context, pairs, batch) + masks_s
            if self.scatter:
                duration *= self.scatter.factor()
            self.now = now = start + duration
            gap = now - start           # every sequence's last token came at the end of the last step
            long = [r for r in running if gap > r.tbt_target_s] if gap > tightest_tbt else ()
            budget.add(now, tolerated, len(long))
            for request in long:
                request.long_gaps += 1
            pending.append(now)
            scheduler.num_steps += 1
            self.num_steps += 1
            if steps_to_finish == 0:
                self._give_tokens(running, pending)
                self._finish_at_max_tokens(running)
            if self.step_listeners:   # a record only for someone who reads it
                record = StepRecord(**(fields | {
                    "step": self.num_steps - 1, "start": start, "duration_s": duration, "forward_s": duration,
                    "num_decode_tokens": batch, "num_sampled": batch, "head_rows": batch, "num_running": len(running),
                    "kv_usage": self.blocks.usage, "context_tokens": context, "attended_pairs": pairs,
                    "token_gaps": (gap,) * batch, "grammar_rows": constrained, "mask_s": masks_s}))
                for listener in self.step_listeners:
                    listener(record)
            context += batch            # the step after: each decode reads one more token and attends to
            pairs += batch              # one more key, attended_pairs(1, c + 1) - attended_pairs(1, c)
        self._give_tokens(running, pending)

    def _by_block_boundary(self, running: list[Request], step: int) -> list[list[Request]]:
        """The running requests by the coasted step (mod block size) at which their next token needs
        a new KV block: each step looks at the one list that may."""
        block_size = self.blocks.block_size
        lists: list[list[Request]] = [[] for _ in range(block_size)]
        for request in running:
            free_slots = len(request.block_table) * block_size - request.num_computed_tokens
            lists[(step + free_slots) % block_size].append(request)
        return lists

    def _grow_for_next_token(self, candidates: list[Request], pending: int) -> bool:
        """Give each request whose next token needs it a new KV block (`pending` tokens computed but
        not given yet); False (nothing taken) if the pool cannot give them all, where the policy would
        preempt."""
        block_size = self.blocks.block_size
        short = [r for r in candidates if r.num_computed_tokens + pending + 1 > len(r.block_table) * block_size]
        if len(short) > self.blocks.num_free_blocks:
            return False
        for request in short:
            self.blocks.grow(request.block_table, request.num_computed_tokens + pending + 1)
        return True

    @staticmethod
    def _give_tokens(running: list[Request], times: list[float]) -> None:
        """Each request's tokens of the coasted steps that ended at `times`."""
        if times:
            zeros, n = [0] * len(times), len(times)
            for request in running:
                request.num_computed_tokens += n
                request.output_token_ids.extend(zeros)
                request.timings.token_times.extend(times)
            times.clear()

    def _finish_at_max_tokens(self, running: list[Request]) -> None:
        for request in [r for r in running if len(r.output_token_ids) >= r.max_tokens]:
            self._finish(request)

    def _finish(self, request: Request) -> None:
        self.scheduler.finish(request, FinishReason.LENGTH)
        record = request_record(request)
        for listener in self.finish_listeners:
            listener(record)

    def _emit_tokens(self, result: ScheduleResult, gaps: list[float] | None,
                     kept: dict[str, int]) -> tuple[int, int]:
        """A token for each request whose chunk reached its last known token (ScheduledRequest.samples),
        and after verified drafts the `kept` ones before it, in one emission: its gap since the previous
        one counted in the error budget first (ErrorBudget.observe) and added to `gaps` if given; those at
        max_tokens finish. Returns how many sampled and how many finished. One fused pass: it runs for
        every request, every step."""
        now, tolerated, long, sampled, finished = self.now, 0.0, 0, 0, 0
        for request, n, c, drafts in result.scheduled:
            outputs = request.output_token_ids
            if c + n - drafts != request.num_prompt_tokens + len(outputs):
                continue
            sampled += 1
            timings = request.timings
            times = timings.token_times
            if times:
                last = times[-1]
                tolerated += request.tbt_tolerance
                is_long = now - last > request.tbt_target_s
                request.long_gaps += is_long
                long += is_long
                if gaps is not None:
                    gaps.append(now - last)
            elif timings.first_token is None:
                timings.first_token = now
                self.scheduler.admission.observe(request, now)
            outputs.extend([0] * (1 + kept[request.request_id]) if drafts else (0,))
            times.append(now)
            if len(outputs) >= request.max_tokens:
                finished += 1
                self._finish(request)
        self.scheduler.error_budget.add(now, tolerated, long)
        return sampled, finished


def _work_left(request: Request) -> int:
    return max(0, request.num_prompt_tokens - request.num_computed_tokens) + request.max_tokens - len(
        request.output_token_ids)
