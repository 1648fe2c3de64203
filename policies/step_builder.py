"""Shared bookkeeping for building one step's plan: token budget, free KV blocks, preemption.

Every policy decides *order*; this class makes sure no plan over-spends tokens, sequences or
KV blocks, and preempts the most recently admitted request when a running one needs a block.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.knobs import Knobs
from policies.plan import BatchPlan, ScheduledChunk
from policies.view import SchedulerView, SequenceState, is_decode, remaining_tokens


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

    @property
    def running(self) -> list[SequenceState]:
        return self._running

    def is_running(self, seq: SequenceState) -> bool:
        """Was running at the start of the step and has not been preempted since."""
        return seq.request_id not in self._preempted

    def decodes(self) -> list[SequenceState]:
        return [s for s in self.view.running if is_decode(s) and self.is_running(s)]

    def partial_prefills(self) -> list[SequenceState]:
        return [s for s in self.view.running if not is_decode(s) and self.is_running(s)]

    def schedule(self, seq: SequenceState, num_tokens: int, preempt: bool = True) -> bool:
        """Give `seq` `num_tokens` more this step (on top of what it already has this step);
        if allowed, preempt later-admitted requests for KV."""
        had_tokens, had_blocks = self._reserved.get(seq.request_id, (0, 0))
        num_tokens = min(num_tokens, self.tokens_left, remaining_tokens(seq) - had_tokens)
        if num_tokens <= 0 or seq.request_id in self._preempted:
            return False
        blocks = self.view.blocks_needed(seq, had_tokens + num_tokens) - had_blocks
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
        self._reserved[seq.request_id] = (had_tokens + num_tokens, had_blocks + blocks)
        chunk = ScheduledChunk(seq.request_id, had_tokens + num_tokens)
        if had_tokens:
            self.plan.scheduled = [chunk if c.request_id == seq.request_id else c for c in self.plan.scheduled]
        else:
            self.plan.scheduled.append(chunk)
        return True

    def schedule_all(self, seqs: Iterable[SequenceState], chunk_cap: int = 0) -> None:
        """Each in turn gets what it still needs (at most `chunk_cap` if set) while the budget lasts."""
        for seq in seqs:
            if self.tokens_left <= 0:
                return
            need = remaining_tokens(seq)
            self.schedule(seq, min(need, chunk_cap) if chunk_cap else need)

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
        budget (no step may exceed the budget, so such a prompt is cut at it)."""
        need = remaining_tokens(seq)
        if need <= self.tokens_left:
            return need
        return self.tokens_left if need > self.knobs.token_budget else 0

    def _preempt(self, victim: SequenceState) -> None:
        self._running.remove(victim)
        self._preempted.add(victim.request_id)
        tokens, blocks = self._reserved.pop(victim.request_id, (0, 0))
        if tokens:
            self.tokens_left += tokens
            self.plan.scheduled = [c for c in self.plan.scheduled if c.request_id != victim.request_id]
        self.free_blocks += blocks + victim.num_blocks
        if victim.request_id in self.plan.admitted:
            self.plan.admitted.remove(victim.request_id)
        else:
            self.plan.preempted.append(victim.request_id)
