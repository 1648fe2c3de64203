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
from typing import Protocol

from engine.block_manager import BlockManager
from engine.prefix_cache import PrefixCachingBlockManager
from simulation.cost_model import CostModel
from engine.llm_engine import request_record, step_record, token_gaps
from engine.model_runner import StepTiming
from engine.outputs import RequestRecord, StepRecord
from engine.request import FinishReason, Request
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduleResult, Scheduler
from engine.slo_class import SloClasses, shipped_slo_classes
from policies import Knobs

IDLE_TICK_S = 0.001   # how far the clock moves when a policy schedules nothing while work waits


class RequestLike(Protocol):
    """What the simulator reads of a workload item (loadgen.workload.RequestSpec has it)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo_class: str | None
    # optional (loadgen.workload.RequestSpec has them): the prompt's first prefix_tokens are its group's
    prefix_group: str | None
    prefix_tokens: int


class Simulator:
    def __init__(self, cost: CostModel, num_blocks: int, block_size: int = 16, policy: str = "sarathi",
                 knobs: Knobs | None = None, coast: bool = True, slo_classes: SloClasses | None = None,
                 prefix_caching: bool = True) -> None:
        self.cost = cost
        self.slo_classes = slo_classes or shipped_slo_classes()
        self.coast = coast    # replay pure-decode stretches without asking the policy (same result, faster)
        self.now = 0.0
        self.blocks = (PrefixCachingBlockManager if prefix_caching else BlockManager)(num_blocks, block_size)
        self.scheduler = Scheduler(self.blocks, policy, knobs, clock=lambda: self.now)
        self.scheduler.cost = cost      # the deadline policy prices steps with the model that times them
        self.scheduler.arrival_guard_s = self.slo_classes.arrival_guard_s()
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.finish_listeners: list[Callable[[RequestRecord], None]] = []
        self.arrival_listeners: list[Callable[[Request], None]] = []
        self.num_steps = 0
        self.num_rejected = 0
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

    def _arrive(self, item: RequestLike) -> None:
        params = SamplingParams(max_tokens=item.output_tokens, ignore_eos=True)
        group = getattr(item, "prefix_group", None)
        request = Request(f"sim-{self._ids}", self._prompt(item, group), params, item.arrival_s,
                          slo=self.slo_classes.get(getattr(item, "slo_class", None)), cacheable=group is not None)
        self._ids += 1
        for listener in self.arrival_listeners:
            listener(request)
        if self.blocks.blocks_for(item.prompt_tokens + item.output_tokens) > self.blocks.num_blocks:
            self.num_rejected += 1     # the engine answers such a request with a 400
            return
        self.scheduler.add(request)

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
        result = self.scheduler.schedule()
        if not result.scheduled:
            self.now += IDLE_TICK_S
            return
        decodes = result.num_decode_tokens      # StepShape.of_schedule(result), without the object
        duration = self.cost.predict_counts(result.num_tokens - decodes, decodes, result.num_sampled,
                                            result.context_tokens, result.attended_pairs, len(result.scheduled))
        self.now += duration
        self.scheduler.commit(result)
        # ScheduledRequest.samples inlined: this runs for every request, every step
        sampling = [r for r, n, c in result.scheduled if c + n == r.num_tokens]
        self.scheduler.error_budget.observe(sampling, self.now)
        gaps = token_gaps(sampling, self.now) if self.step_listeners else ()
        self._emit_tokens(sampling)
        record = None
        if self.step_listeners:           # a record only for someone who reads it
            record = step_record(self.num_steps, result, self.scheduler, len(sampling), start, duration, 0.0,
                                 StepTiming(0.0, duration, 0.0), gaps)
        self.num_steps += 1
        for listener in self.step_listeners:
            listener(record)
        if self.coast and self._steady(result):
            self._coast(result, record, t_end)

    def _steady(self, result: ScheduleResult) -> bool:
        """Every running request just decoded and nothing waits: until an arrival, a finish, a knob
        change or a new KV block is needed, every policy plans this same all-decode step again."""
        s = self.scheduler
        return (not s.waiting and not result.num_preempted and not s.has_pending_change
                and len(result.scheduled) == len(s.running) and result.num_decode_tokens == len(s.running))

    def _coast(self, result: ScheduleResult, record: StepRecord | None, t_end: float) -> None:
        running = self.scheduler.running
        steps_left = min(r.params.max_tokens - r.num_output_tokens for r in running) - 1  # a finish runs a real step
        next_arrival = self._pending[0].arrival_s if self._pending else float("inf")
        batch = len(running)
        context, pairs = result.context_tokens, result.attended_pairs
        fields = vars(record) if record is not None else {}
        stop_at = min(next_arrival, t_end)
        budget = self.scheduler.error_budget
        tolerated = sum(1.0 - r.slo.tbt_percentile / 100.0 for r in running)
        steps_to_block = 0    # steps until some sequence's next token needs a new KV block
        for _ in range(steps_left):
            if self.now >= stop_at:
                return
            if steps_to_block == 0:
                steps_to_block = self._grow_for_next_token(running)
                if steps_to_block == 0:
                    return
            steps_to_block -= 1
            context += batch            # each sequence attends to one more token than last step
            pairs += batch
            start, duration = self.now, self.cost.predict_counts(0, batch, batch, context, pairs, batch)
            self.now += duration
            long = [r for r in running if duration > r.tbt_target_s]
            budget.add(self.now, tolerated, len(long))
            for request in long:
                request.long_gaps += 1
            for request in running:
                request.num_computed_tokens += 1
                request.output_token_ids.append(0)
                request.timings.token_times.append(self.now)
            self.scheduler.num_steps += 1
            self.num_steps += 1
            if self.step_listeners:   # a record only for someone who reads it
                record = StepRecord(**(fields | {"step": self.num_steps - 1, "start": start, "duration_s": duration,
                                                 "forward_s": duration, "context_tokens": context,
                                                 "attended_pairs": pairs, "token_gaps": (duration,) * batch}))
                for listener in self.step_listeners:
                    listener(record)

    def _grow_for_next_token(self, running: list[Request]) -> int:
        """Give each request the KV block its next token needs and return how many tokens they can
        all take before one needs another; 0 (nothing taken) if they do not all fit, which is where
        the policy would preempt."""
        capacity = self.blocks.block_size
        short = [r for r in running if r.num_computed_tokens + 1 > len(r.block_table) * capacity]
        if len(short) > self.blocks.num_free_blocks:
            return 0
        for request in short:
            self.blocks.grow(request.block_table, request.num_computed_tokens + 1)
        return min(len(r.block_table) * capacity - r.num_computed_tokens for r in running)

    def _emit_tokens(self, sampling: list[Request]) -> None:
        now = self.now
        for request in sampling:
            outputs = request.output_token_ids
            outputs.append(0)
            timings = request.timings
            timings.first_token = timings.first_token or now
            timings.token_times.append(now)
            if len(outputs) >= request.max_tokens:
                self.scheduler.finish(request, FinishReason.LENGTH)
                record = request_record(request)
                for listener in self.finish_listeners:
                    listener(record)
