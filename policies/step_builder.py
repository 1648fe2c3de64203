"""Shared bookkeeping for building one step's plan: token budget, free KV blocks, preemption.

Every policy decides *order*; this class makes sure no plan over-spends tokens, sequences or
KV blocks, and preempts the most recently admitted request when a running one needs a block.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.knobs import Knobs
from policies.plan import BatchPlan, ScheduledChunk
from policies.view import SchedulerView, SequenceState, remaining_tokens

_NOTHING = (0, 0)


class StepBuilder:
    def __init__(self, view: SchedulerView, knobs: Knobs) -> None:
        self.view = view
        self.knobs = knobs
        self.tokens_left = knobs.token_budget
        self.free_blocks = view.free_blocks
        self.plan = BatchPlan()
        self._running = list(view.running)              # still running, in admission order
        self._reserved: dict[str, tuple[int, int]] = {}  # request_id -> (tokens, blocks) this step
        self._preempted: set[str] = set()
        self._split: tuple[list[SequenceState], list[SequenceState]] | None = None
        self._split_at = 0

    @property
    def running(self) -> list[SequenceState]:
        return self._running

    def decodes(self) -> list[SequenceState]:
        return list(self._split_running()[0])

    def partial_prefills(self) -> list[SequenceState]:
        return list(self._split_running()[1])

    def _split_running(self) -> tuple[list[SequenceState], list[SequenceState]]:
        """(decodes, partial prefills) among the requests still running, in admission order, in one
        pass (this runs for every request every step). Kept until the next
        preemption: a plan changes no request, only which ones are still running."""
        if self._split is not None and self._split_at == len(self._preempted):
            return self._split
        decodes, prefills, preempted = [], [], self._preempted
        for s in self.view.running:
            if preempted and s.request_id in preempted:
                continue
            computed = s.num_computed_tokens
            if s.num_tokens - computed == 1 and computed >= s.num_prompt_tokens:   # is_decode_work, inlined
                decodes.append(s)
            else:
                prefills.append(s)
        self._split, self._split_at = (decodes, prefills), len(preempted)
        return self._split

    def schedule(self, seq: SequenceState, num_tokens: int, preempt: bool = True) -> bool:
        """Give `seq` `num_tokens` more this step (on top of what it already has this step);
        if allowed, preempt later-admitted requests for KV."""
        request_id = seq.request_id
        had_tokens, had_blocks = self._reserved.get(request_id, _NOTHING)
        computed = seq.num_computed_tokens
        num_tokens = min(num_tokens, self.tokens_left, seq.num_tokens - computed - had_tokens)
        if num_tokens <= 0 or request_id in self._preempted:
            return False
        # view.blocks_needed(seq, had_tokens + num_tokens), inlined: this runs for every request every step
        groups = self.view.kv_groups
        if groups is None:
            block_size = self.view.block_size
            blocks = max(0, -(-(computed + had_tokens + num_tokens) // block_size) - seq.num_blocks) - had_blocks
        else:
            end = computed + had_tokens + num_tokens
            blocks = max(0, groups.pages_for(computed, end) - seq.num_blocks) - had_blocks
        while blocks > self.free_blocks:
            # the victim is always the most recently admitted request; when that is `seq` itself,
            # it yields its own KV, so older requests always make progress
            victim = self._running[-1] if preempt and self._running else None
            if victim is None or victim is seq or seq not in self._running:
                if victim is seq and not had_tokens:
                    self._preempt(seq)
                return False
            self._preempt(victim)
        self.free_blocks -= blocks
        self.tokens_left -= num_tokens
        self._reserved[request_id] = (had_tokens + num_tokens, had_blocks + blocks)
        chunk = ScheduledChunk(request_id, had_tokens + num_tokens)
        if had_tokens:
            self.plan.scheduled[:] = [chunk if c.request_id == request_id else c for c in self.plan.scheduled]
        else:
            self.plan.scheduled.append(chunk)
        return True

    def schedule_decodes(self) -> list[SequenceState]:
        """schedule_all(decodes()): every running decode gets its token while the budget and the KV
        pool last; returns those that did, in admission order. One pass that also splits the running
        requests as _split_running does: it runs for every request, every step."""
        decodes, prefills, scheduled = [], [], []
        reserved, preempted, preempted_before = self._reserved, self._preempted, len(self._preempted)
        for seq in self.view.running:
            request_id = seq.request_id
            if preempted_before and request_id in preempted:
                continue
            computed = seq.num_computed_tokens
            if seq.num_tokens - computed != 1 or computed < seq.num_prompt_tokens:   # is_decode_work, inlined
                prefills.append(seq)
                continue
            decodes.append(seq)
            if self.tokens_left > 0 and (
                    (request_id not in reserved and request_id not in preempted
                     and self._take_one_token(seq, request_id, computed)) or self.schedule(seq, 1)):
                scheduled.append(seq)
        self._split, self._split_at = (decodes, prefills), preempted_before
        if len(preempted) > preempted_before:     # a decode preempted for a later one's block left the step
            scheduled = [d for d in scheduled if d.request_id in reserved]
        return scheduled

    def schedule_all(self, seqs: Iterable[SequenceState], chunk_cap: int = 0) -> None:
        """Each in turn gets what it still needs (at most `chunk_cap` if set) while the budget lasts."""
        reserved, preempted = self._reserved, self._preempted
        for seq in seqs:
            if self.tokens_left <= 0:
                return
            computed = seq.num_computed_tokens
            need = seq.num_tokens - computed
            request_id = seq.request_id
            if not (need == 1 and request_id not in reserved and request_id not in preempted
                    and self._take_one_token(seq, request_id, computed)):
                self.schedule(seq, min(need, chunk_cap) if chunk_cap else need)

    def _take_one_token(self, seq: SequenceState, request_id: str, computed: int) -> bool:
        """schedule(seq, 1) for a request new to this step, cut short for decodes (every running
        request, every step); False, taking nothing, where its block needs a preemption (schedule()
        then takes the full path)."""
        groups = self.view.kv_groups
        if groups is None:
            block_size = self.view.block_size
            blocks = max(0, (computed + block_size) // block_size - seq.num_blocks)
        else:
            blocks = max(0, groups.pages_for(computed, computed + 1) - seq.num_blocks)
        if blocks > self.free_blocks:
            return False
        self.free_blocks -= blocks
        self.tokens_left -= 1
        self._reserved[request_id] = (1, blocks)
        self.plan.scheduled.append(ScheduledChunk(request_id, 1))
        return True

    def add_drafts(self, seq: SequenceState, k: int) -> int:
        """Let scheduled decode `seq` verify up to `k` drafted tokens, as the budget and the free KV hold
        them (no preemption for a draft); returns how many."""
        request_id = seq.request_id
        tokens, blocks = self._reserved.get(request_id, _NOTHING)
        k = min(k, self.tokens_left)
        while k > 0:
            more = self.view.blocks_needed(seq, tokens + k) - blocks
            if more <= self.free_blocks:
                break
            k -= 1
        if k <= 0:
            return 0
        self.free_blocks -= more
        self.tokens_left -= k
        self._reserved[request_id] = (tokens, blocks + more)
        self.plan.drafts[request_id] = k
        return k

    def admit(self, seq: SequenceState, num_tokens: int, keep_free_blocks: int = 0) -> bool:
        """Start a waiting request if it fits the sequence limit, the budget and the free KV
        (leaving `keep_free_blocks` untouched). Admission never preempts, and no request is admitted
        in a step that had to preempt: the KV it would take is what the preempted ones need back."""
        if seq.request_id in self._reserved:          # admitted earlier this step: a bigger chunk
            return self.schedule(seq, num_tokens, preempt=False)
        if len(self._running) >= self.knobs.max_num_seqs or num_tokens <= 0 or self._preempted:
            return False
        if self.view.blocks_needed(seq, min(num_tokens, self.tokens_left)) > self.free_blocks - keep_free_blocks:
            return False
        if not self.schedule(seq, num_tokens, preempt=False):
            return False
        self._running.append(seq)
        self.plan.admitted.append(seq.request_id)
        return True

    def admit_in_order(self, waiting: Iterable[SequenceState], size=None) -> None:
        """Admit in queue order and stop at the first request that does not fit, so none is starved.
        `size(seq)` is the tokens to give a newcomer (default: all it needs, cut by the budget)."""
        for seq in waiting:
            if self.tokens_left <= 0:
                return
            if not self.admit(seq, size(seq) if size else remaining_tokens(seq)):
                return

    def whole_prefill_size(self, seq: SequenceState) -> int:
        """For policies that do not chunk: all of the prefill if it fits what is left of the budget,
        0 to wait for a step with room, and the rest of the budget for a prompt longer than the whole
        budget (no step may exceed the budget, so such a prompt is cut at it).

        A prompt is started only when the free KV holds all of it, as vLLM v0's `can_allocate`:
        admitting on its first chunk's blocks alone let a recomputed request be re-admitted, refill
        the pool and be preempted again before its prefill ended, a thrash that never finished."""
        need = remaining_tokens(seq)
        if self.view.blocks_to_hold(seq, need, self.knobs.token_budget) > self.free_blocks:
            return 0
        if need <= self.tokens_left:
            return need
        return self.tokens_left if need > self.knobs.token_budget else 0

    def _preempt(self, victim: SequenceState) -> None:
        self._running.remove(victim)
        self._preempted.add(victim.request_id)
        tokens, blocks = self._reserved.pop(victim.request_id, (0, 0))
        tokens += self.plan.drafts.pop(victim.request_id, 0)
        if tokens:
            self.tokens_left += tokens
            self.plan.scheduled[:] = [c for c in self.plan.scheduled if c.request_id != victim.request_id]
        self.free_blocks += blocks + self.view.blocks_freed_by_preempting(victim)
        if victim.request_id in self.plan.admitted:
            self.plan.admitted.remove(victim.request_id)
        else:
            self.plan.preempted.append(victim.request_id)
