"""Shared bookkeeping for building one step's plan: token budget, free KV blocks, preemption.

Every policy decides *order*; this class makes sure no plan over-spends tokens, sequences or
KV blocks, and preempts the most recently admitted request when a running one needs a block.
"""

from __future__ import annotations

from policies.knobs import Knobs
from policies.plan import BatchPlan, ScheduledChunk
from policies.view import SchedulerView, SequenceState, remaining_tokens


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

    def is_scheduled(self, seq: SequenceState) -> bool:
        return seq.request_id in self._reserved

    def schedule(self, seq: SequenceState, num_tokens: int, preempt: bool = True) -> bool:
        """Give `seq` `num_tokens` this step; preempt later-admitted requests for KV if allowed."""
        num_tokens = min(num_tokens, self.tokens_left, remaining_tokens(seq))
        if num_tokens <= 0 or self.is_scheduled(seq):
            return False
        blocks = self.view.blocks_needed(seq, num_tokens)
        while blocks > self.free_blocks:
            if not preempt or not self._preempt_one(exclude=seq):
                if preempt and self.is_running(seq):  # nothing left to take from: it yields its own KV
                    self._preempt(seq)
                return False
        self.free_blocks -= blocks
        self.tokens_left -= num_tokens
        self._reserved[seq.request_id] = (num_tokens, blocks)
        self.plan.scheduled.append(ScheduledChunk(seq.request_id, num_tokens))
        return True

    def admit(self, seq: SequenceState, num_tokens: int) -> bool:
        """Start a waiting request if it fits the sequence limit, the budget and the free KV."""
        if len(self._running) >= self.knobs.max_num_seqs:
            return False
        if not self.schedule(seq, num_tokens, preempt=False):
            return False
        self._running.append(seq)
        self.plan.admitted.append(seq.request_id)
        return True

    def admit_in_order(self, waiting) -> None:
        """FCFS admission: stop at the first request that does not fit, so none is starved."""
        for seq in waiting:
            if self.tokens_left <= 0 or not self.admit(seq, remaining_tokens(seq)):
                return

    def _preempt_one(self, exclude: SequenceState) -> bool:
        for victim in reversed(self._running):
            if victim is not exclude:
                self._preempt(victim)
                return True
        return False

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
