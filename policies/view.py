"""The read-only state a policy plans from."""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from policies.draft_lengths import DraftOffer
    from policies.step_shape import WindowedShape


class SequenceState(Protocol):
    """What a policy may read of a request (engine.scheduling.request.Request satisfies it; never mutate it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def arrival_time(self) -> float: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_tokens(self) -> int: ...             # prompt + generated so far: what must be in the KV cache
    @property
    def num_computed_tokens(self) -> int: ...    # how many of them already are
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...             # the request's output limit
    @property
    def ttft_deadline(self) -> float: ...        # arrival + its SLO class's TTFT target
    @property
    def tbt_target_s(self) -> float: ...         # its SLO class's TBT target
    @property
    def last_token_time(self) -> float | None: ...
    @property
    def spare_long_gaps(self) -> int: ...        # long gaps its own TBT percentile can still absorb
    @property
    def scores_prompt(self) -> bool: ...         # it asks for prompt logprobs: its chunks run the LM head per position
    @property
    def grammar(self) -> object | None: ...      # not None: held to a grammar, each sampled row costs a mask


class KvPages(Protocol):
    """A pool of pages per layer group (engine.kv_cache.kv_groups.KvGroups has it), for a model whose
    sliding-window layers give their pages back as each request's window passes."""

    num_full: int                                # global layer groups: a page per block of every token

    def pages_for(self, computed: int, end: int) -> int: ...   # pages held computing tokens [computed, end)


class StepCost(Protocol):
    """A step-time model (simulation.cost_model.CostModel has it): seconds for a step of this shape."""

    tile_tokens: int                             # prefill chunks of a multiple of this are cheapest per token
    grammar_row_s: float                         # added per sampled row held to a grammar (its mask)
    # and, where the model has measured verification steps, draft_row_s(tokens, context) -> float | None:
    # the seconds one drafted row adds to a step of `tokens` tokens (simulation.cost_model.CostModel)

    def predict_counts(self, prefill: int, decode: int, sampled: int, context: int, pairs: int,
                       seqs: int) -> float: ...


def remaining_tokens(seq: SequenceState) -> int:
    return seq.num_tokens - seq.num_computed_tokens


def decode_tokens_left(seq: SequenceState) -> int:
    """Output tokens this request may still produce (each needs a KV slot)."""
    return max(0, seq.max_tokens - seq.num_output_tokens)


def is_decode_work(num_new_tokens: int, num_computed: int, num_prompt_tokens: int) -> bool:
    """The one definition of a decode: one new token past a fully computed prompt. A resumed
    (preempted) request recomputes its outputs too, so it is a prefill until it has caught up."""
    return num_new_tokens == 1 and num_computed >= num_prompt_tokens


def is_decode(seq: SequenceState) -> bool:
    """Whether this running request's next step is a decode."""
    return is_decode_work(remaining_tokens(seq), seq.num_computed_tokens, seq.num_prompt_tokens)


@dataclass(frozen=True)
class SchedulerView:
    running: Sequence[SequenceState]   # admitted, holding KV, in admission order
    waiting: Sequence[SequenceState]   # not admitted (new, or preempted and to be recomputed), queue order
    free_blocks: int
    total_blocks: int
    block_size: int
    now: float = 0.0
    step: int = 0                       # engine step counter, for policies that alternate
    cost: StepCost | None = None        # the engine's step-time model, for policies that size steps by time
    tolerated_long_gaps: float = 0.0    # token gaps over their TBT target that the SLO percentile tolerates
    long_gaps: int = 0                  # ... and those that happened, over the same recent horizon
    arrival_guard_s: float = math.inf   # the longest step an arrival of the tightest SLO class can wait out
    # with prefix caching, blocks a request shares stay held when it is preempted: the blocks it alone holds
    exclusive_blocks: Callable[[SequenceState], int] | None = None
    # a model with sliding-window layers: blocks are pages of layer groups, the sliding ones given back as
    # each request's window passes (engine/kv_cache/kv_groups.py)
    kv_groups: KvPages | None = None
    step_shape: WindowedShape | None = None   # sliding-window layers: what a step attends to (step_shape.py)
    # speculative decoding (engine/speculation/): the drafter's offers for planned decodes; None: no drafting
    draft_offers: Callable[[Sequence[SequenceState]], list[DraftOffer]] | None = None
    output_share: float = 0.0           # the share of their max_tokens finished requests used (output_share.py)

    def blocks_needed(self, seq: SequenceState, num_new_tokens: int) -> int:
        """Blocks `seq` must gain to hold `num_new_tokens` more computed tokens."""
        computed = seq.num_computed_tokens
        if self.kv_groups is not None:
            return max(0, self.kv_groups.pages_for(computed, computed + num_new_tokens) - seq.num_blocks)
        total = -(-(computed + num_new_tokens) // self.block_size)
        return max(0, total - seq.num_blocks)

    def blocks_to_hold(self, seq: SequenceState, num_new_tokens: int, chunk: int) -> int:
        """Blocks `seq` must gain to hold `num_new_tokens` more computed tokens, computed in chunks of at most
        `chunk`: blocks_needed, except that with sliding-window layers the pages held peak at the last chunk
        (the windows have given back what came before it)."""
        if self.kv_groups is None:
            return self.blocks_needed(seq, num_new_tokens)
        end = seq.num_computed_tokens + num_new_tokens
        return max(0, self.kv_groups.pages_for(max(seq.num_computed_tokens, end - chunk), end) - seq.num_blocks)

    def blocks_freed_by_preempting(self, seq: SequenceState) -> int:
        if self.exclusive_blocks is None:
            return seq.num_blocks
        return self.exclusive_blocks(seq)

    @property
    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.total_blocks
