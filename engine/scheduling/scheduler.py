"""The scheduler loop's bookkeeping: queues, knobs and policy, and applying a policy's plan.

Each step it hands the active policy a read-only view, checks and applies the plan (preempt,
admit, grow block tables) and returns the requests to compute with their token counts. Knob and
policy changes are queued and take effect at the next step boundary.
"""

from __future__ import annotations

import math

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from engine.kv_cache.block_manager import BlockManager
from engine.scheduling.admission import AdmissionControl
from engine.scheduling.error_budget import ErrorBudget
from engine.scheduling.output_share import OutputShare
from engine.scheduling.request import FinishReason, Request, RequestStatus
from policies import DEFAULT_POLICY, BatchPlan, Knobs, SchedulerView, get_policy
from policies.registry import Policy
from policies.step_shape import WindowedShape, head_rows, samples, shape_functions
from policies.view import StepCost, is_decode_work

if TYPE_CHECKING:       # the speculation room comes after this one: set from outside (LLMEngine, the simulator)
    from engine.speculation.speculator import Speculator


class ScheduledRequest(NamedTuple):   # a named tuple: made for every request every step, cheaper than a frozen dataclass
    request: Request
    num_tokens: int         # drafted tokens included
    context_len: int        # tokens already cached before this step
    num_drafts: int = 0     # a decode verifying this many drafted tokens (request.draft_token_ids): num_tokens - 1

    @property
    def samples(self) -> bool:
        """This chunk reaches the last known token, so the step yields a new token (or, verifying drafts,
        one to 1 + num_drafts of them) for it."""
        return samples(self.num_tokens - self.num_drafts, self.context_len, self.request.num_tokens)

    @property
    def is_decode(self) -> bool:
        """A decode, verifying drafts or not: it runs as 1 + num_drafts decode-shaped rows."""
        return is_decode_work(self.num_tokens - self.num_drafts, self.context_len, self.request.num_prompt_tokens)


class CacheStep(NamedTuple):
    """What the prefix cache did in one step: tokens of first admissions looked up and found, blocks
    evicted, and blocks cached at the end of scheduling."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0
    cached_blocks: int = 0


NO_CACHE_STEP = CacheStep()


@dataclass(frozen=True)
class ScheduleResult:
    scheduled: list[ScheduledRequest]   # decodes first, then prefill chunks
    num_preempted: int
    knobs: Knobs
    policy: str
    # what the step computes, for step records and the cost model
    num_decode_tokens: int = 0
    num_tokens: int = 0
    context_tokens: int = 0             # tokens attended to (KV read), summed over sequences
    attended_pairs: int = 0             # (query, key) pairs: each new token sees the context and the chunk up to itself
    num_sampled: int = 0                # rows through the LM head: chunks reaching their last token (they yield a
                                        # token) plus prompt positions scored for prompt logprobs (head_rows)
    cache: CacheStep = NO_CACHE_STEP
    num_grammar_rows: int = 0           # sampled rows held to a grammar (each priced with its mask's time)
    num_draft_tokens: int = 0           # drafted tokens verified: each one more decode-shaped row (in num_decode_tokens)
    num_rows: int = 0                   # sequences of the step's layout: a verifying decode counts 1 + its drafts

    @staticmethod
    def of(scheduled: list[ScheduledRequest], num_preempted: int, knobs: Knobs, policy: str,
           cache: CacheStep | None = None, shape: WindowedShape | None = None) -> ScheduleResult:
        """Orders `scheduled` in place, decodes first (stable), and sums what the step computes
        (policies.step_shape per request). One pass, `num_tokens` read off the fields: it runs for
        every request every step."""
        decodes, others = [], []
        tokens = context = pairs = sampled = grammar_rows = drafts = decode_rows = 0
        context_tokens, attended_pairs = shape_functions(shape)
        for s in scheduled:
            n, c, request, d = s.num_tokens, s.context_len, s.request, s.num_drafts
            tokens += n
            if d:        # a decode verifying d drafts: d + 1 decode rows at contexts c .. c + d
                decodes.append(s)
                drafts += d
                decode_rows += d + 1
                for j in range(d + 1):
                    context += context_tokens(1, c + j)
                    pairs += attended_pairs(1, c + j)
                sampled += d + 1
                grammar_rows += (d + 1) * (request.grammar is not None)
                continue
            if is_decode_work(n, c, request.num_prompt_tokens):
                decodes.append(s)
                decode_rows += 1
            else:
                others.append(s)
            context += context_tokens(n, c)
            pairs += attended_pairs(n, c)
            sampled += head_rows(n, c, request)
            if request.grammar is not None and samples(n, c, request.num_tokens):
                grammar_rows += 1
        scheduled[:] = decodes + others
        return ScheduleResult(scheduled, num_preempted, knobs, policy, decode_rows, tokens, context, pairs, sampled,
                              cache or NO_CACHE_STEP, grammar_rows, drafts, decode_rows + len(others))


class Scheduler:
    def __init__(self, block_manager: BlockManager, policy: str = DEFAULT_POLICY, knobs: Knobs | None = None,
                 clock: Callable[[], float] = time.monotonic, shape: WindowedShape | None = None) -> None:
        self.blocks = block_manager
        self.shape = shape              # a model with sliding-window layers: what its steps attend to (step_shape.py)
        self.clock = clock              # the simulator passes its virtual clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.policy: Policy = get_policy(policy)
        self.knobs = knobs or Knobs()
        self._pending: tuple[Policy | None, Knobs | None] = (None, None)
        self._lock = threading.Lock()
        self.num_preemptions = 0
        self.num_steps = 0
        self._by_id: dict[str, Request] = {}   # every unfinished request, for applying plans by id
        self.cost: StepCost | None = None      # step-time model for policies that size steps by time
        self.error_budget = ErrorBudget()      # the engine and the simulator report each step's gaps
        self.arrival_guard_s = math.inf        # SloClasses.arrival_guard_s() of the classes requests may name
        self.admission = AdmissionControl()    # predicted-TTFT admission and the late rule (admission.py)
        self.speculator: Speculator | None = None   # drafts for decodes (engine/speculation/); None: never drafts
        self.output_share = OutputShare()      # what finished requests used of max_tokens: KV the deadline policy keeps

    # -- changes from other threads, applied at the next step boundary --
    def set_knobs(self, knobs: Knobs) -> None:
        with self._lock:
            self._pending = (self._pending[0], knobs)

    def set_policy(self, name: str) -> None:
        policy = get_policy(name)
        with self._lock:
            self._pending = (policy, self._pending[1])

    @property
    def latest_knobs(self) -> Knobs:
        """The knobs the next step will use: a pending change, else the current ones."""
        with self._lock:
            return self._pending[1] or self.knobs

    @property
    def latest_policy(self) -> str:
        """The policy the next step will use: a pending change, else the current one."""
        with self._lock:
            return (self._pending[0] or self.policy).name

    @property
    def has_pending_change(self) -> bool:
        return self._pending != (None, None)

    def _apply_pending(self) -> None:
        with self._lock:
            policy, knobs = self._pending
            self._pending = (None, None)
        self.policy = policy or self.policy
        self.knobs = knobs or self.knobs

    # -- queues --
    def add(self, request: Request) -> None:
        self.waiting.append(request)
        self._by_id[request.request_id] = request

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request, reason: FinishReason) -> None:
        """Leave whichever queue it is in and give its KV back."""
        if request.status is RequestStatus.FINISHED:
            return
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._release(request)
        del self._by_id[request.request_id]
        if self.speculator is not None:
            self.speculator.forget(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.output_share.observe(request.num_output_tokens, request.max_tokens)
        request.timings.finished = self.clock()

    def _release(self, request: Request) -> None:
        self.blocks.release(request)
        request.num_computed_tokens = 0
        request.cache.forget_blocks()

    # -- one step --
    def schedule(self) -> ScheduleResult:
        self._apply_pending()
        now = self.clock()
        tolerated, long = self.error_budget.state(now)
        caching = self.blocks.caching
        if caching:
            before = self._probe_waiting()
        view = SchedulerView(self.running, self.waiting, self.blocks.num_free_blocks, self.blocks.num_blocks,
                             self.blocks.block_size, now, self.num_steps, self.cost, tolerated, long,
                             self.arrival_guard_s, self._exclusive_blocks if caching else None,
                             self.blocks.groups, self.shape, self._draft_offers(), self.output_share.value)
        self.num_steps += 1
        plan = self.policy.plan(view, self.knobs)
        self._check(plan)
        by_id = self._by_id
        self._preempt([by_id[i] for i in plan.preempted])
        self._admit([by_id[i] for i in plan.admitted])
        scheduled = []
        grow, block_size = self.blocks.grow_request, self.blocks.block_size
        for request_id, num_tokens in plan.scheduled:
            request = by_id[request_id]
            context = request.num_computed_tokens
            drafts = 0
            if plan.drafts and request_id in plan.drafts:   # a decode verifying drafted tokens (the plan counted them)
                request.draft_token_ids = self.speculator.drafted(request_id, plan.drafts[request_id])
                drafts = len(request.draft_token_ids)
                num_tokens += drafts
            if context + num_tokens > len(request.block_table) * block_size:   # most steps need no block:
                grow(request, context + num_tokens)                            # skip the call (every request, every step)
            scheduled.append(ScheduledRequest(request, num_tokens, context, drafts))
        cache = self._cache_step(before) if caching else None
        return ScheduleResult.of(scheduled, len(plan.preempted), self.knobs, self.policy.name, cache, self.shape)

    def _draft_offers(self) -> Callable[[list[Request]], list] | None:
        """The speculator's offers for the policy to price (SchedulerView.draft_offers), where it drafts."""
        if self.speculator is None:
            return None
        self.speculator.begin_step()
        if self.knobs.speculative_tokens <= 0:
            return None
        speculator, knobs = self.speculator, self.knobs
        return lambda decodes: speculator.offers(decodes, knobs)

    def _exclusive_blocks(self, request: Request) -> int:
        return self.blocks.exclusive_blocks(request)

    def _probe_waiting(self) -> CacheStep:
        """Each waiting request's cached prefix counts as computed before the policy plans; returns
        the cache's counters, to tell this step's share of them."""
        probe = self.blocks.probe
        for request in self.waiting:
            if request.cache.stale:     # a probe is kept until a key it looked at changes
                probe(request)
        stats = self.blocks.stats
        return CacheStep(stats.queries, stats.hits, stats.evictions)

    def _cache_step(self, before: CacheStep) -> CacheStep:
        stats = self.blocks.stats
        return CacheStep(stats.queries - before.queries, stats.hits - before.hits,
                         stats.evictions - before.evictions, self.blocks.num_cached_blocks)

    def _check(self, plan: BatchPlan) -> None:
        """Plans are trusted to be frugal, but a broken one must fail loudly, not corrupt the cache."""
        ids, counts = zip(*plan.scheduled) if plan.scheduled else ((), ())
        if plan.num_tokens > self.knobs.token_budget:
            raise RuntimeError(f"{self.policy.name} planned {plan.num_tokens} tokens over a budget of "
                               f"{self.knobs.token_budget}")
        if plan.drafts and not set(plan.drafts) <= set(ids):
            raise RuntimeError(f"{self.policy.name} planned drafts for a request it did not schedule")
        if len(ids) != len(set(ids)) or (counts and min(counts) < 1):
            raise RuntimeError(f"{self.policy.name} planned a request twice or for no tokens")

    def _preempt(self, victims: list[Request]) -> None:
        for request in victims:
            self.running.remove(request)
            self._release(request)
            request.status = RequestStatus.PREEMPTED
            request.num_preemptions += 1
            self.num_preemptions += 1
        # back to the head of the queue, oldest first, so they resume before newer arrivals
        for request in sorted(victims, key=lambda r: r.arrival_time, reverse=True):
            self.waiting.appendleft(request)

    def _admit(self, admitted: list[Request]) -> None:
        for request in admitted:
            self.waiting.remove(request)
            if self.blocks.caching:
                self.blocks.acquire(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            if request.timings.first_scheduled is None:
                request.timings.first_scheduled = self.clock()

    def commit(self, result: ScheduleResult, accepted: dict[str, int] | None = None) -> None:
        """The step ran: its tokens are now in the KV cache. `accepted`: for each decode that verified drafts,
        how many of them were kept; the KV of the rest is rolled back (positions past them are not computed,
        their blocks freed), and the request's drafts cleared."""
        for request, num_tokens, context_len, num_drafts in result.scheduled:
            if num_drafts:
                kept = (accepted or {}).get(request.request_id, 0)
                request.num_computed_tokens = context_len + 1 + kept
                self.blocks.trim(request, request.num_computed_tokens)
                if self.speculator is not None:
                    self.speculator.observe(request.request_id, num_drafts, kept, result.knobs)
            else:
                request.num_computed_tokens = context_len + num_tokens
        if self.blocks.caching:
            register = self.blocks.register
            for s in result.scheduled:
                register(s.request)
        if self.blocks.groups is not None:   # after registering: a block the window passed stays cached, unheld
            slide = self.blocks.slide
            for s in result.scheduled:
                slide(s.request)
        if result.num_draft_tokens:          # after registering: the kept drafts are tokens of the cached blocks
            for s in result.scheduled:
                s.request.draft_token_ids = []
