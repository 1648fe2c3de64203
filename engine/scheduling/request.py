"""A request's life: waiting -> running (catching its computed tokens up to its known tokens) ->
finished, with preemption sending it back to waiting to be recomputed from scratch."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv_cache.prefix_cache import PrefixState
from engine.sampling_params import SamplingParams
from engine.slo_class import DEFAULT_CLASS, SloClass

if TYPE_CHECKING:
    from engine.structured.grammar_state import GrammarState


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"   # waiting again; its KV was freed and will be recomputed
    FINISHED = "finished"


class FinishReason(enum.Enum):
    STOP = "stop"             # EOS, a stop token id or a stop string
    LENGTH = "length"         # max_tokens or the model's max length
    ABORT = "abort"           # the client went away or the server shut down
    ERROR = "error"           # this request failed; the engine goes on
    SHED = "shed"             # refused or ended by admission (engine/scheduling/admission.py): overload


@dataclass
class RequestTimings:
    """token_times: one per emission, a step that gave the request one or more tokens (a jump-forward or a
    verified draft gives several at once): TBT is the gap between consecutive emissions, never zero."""
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # a model with sliding-window layers (engine/kv_cache/kv_groups.py): the tables of layer groups 1.., position
    # by position, sliding groups' entries before slid_blocks given back (NULL_PAGE); group_pages: pages held there
    group_tables: list[list[int]] = field(default_factory=list)
    group_pages: int = 0
    slid_blocks: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    output_text: str = ""
    slo: SloClass = DEFAULT_CLASS
    timings: RequestTimings = field(init=False)
    # plain attributes, not properties: policies read them for every request on every step
    num_prompt_tokens: int = field(init=False)
    max_tokens: int = field(init=False)
    ttft_deadline: float = field(init=False)     # arrival + the class's TTFT target
    tbt_target_s: float = field(init=False)
    tbt_tolerance: float = field(init=False)     # share of its gaps the TBT percentile lets run long (0.01 at P99)
    long_gaps: int = 0                           # token gaps over tbt_target_s so far (ErrorBudget counts them)
    # prefix caching (engine/kv_cache/prefix_cache.py): the tenant's salt, whether its blocks may be shared at all
    # (the simulator's requests without shared content are not, to skip hashing them), its cache state
    cache_salt: str | None = None
    cacheable: bool = True
    follows: str | None = None                   # a fork of this request: admitted once its prompt is in the KV
    grammar: GrammarState | None = None          # constrained decoding (engine/structured/): its grammar's state
    predicted_ttft_s: float | None = None        # admission's prediction when it was admitted (admission.py)
    # speculative decoding (engine/speculation/): the drafted tokens this step verifies after its last known one
    draft_token_ids: list[int] = field(default_factory=list)
    cache: PrefixState = field(init=False)
    scores_prompt: bool = field(init=False)      # prompt logprobs: every prompt position computed and scored

    def __post_init__(self) -> None:
        self.timings = RequestTimings(self.arrival_time)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_tokens = self.params.max_tokens
        self.ttft_deadline = self.arrival_time + self.slo.ttft_s
        self.tbt_target_s = self.slo.tbt_s
        self.tbt_tolerance = 1.0 - self.slo.tbt_percentile / 100.0
        self.cache = PrefixState()
        self.scores_prompt = self.params.prompt_logprobs is not None
        if self.scores_prompt:          # a cached block's positions would never be computed, so never scored
            self.cacheable = False

    # -- the read-only view policies see (policies.view.SequenceState) --
    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    @property
    def num_blocks(self) -> int:
        """Blocks (pages, in every layer group) it holds; a waiting request counts the cached blocks of its
        prefix that other requests hold (admitting it takes no free block for them)."""
        return len(self.block_table) + self.group_pages + self.cache.held_hits

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def last_token_time(self) -> float | None:
        times = self.timings.token_times
        return times[-1] if times else None

    @property
    def spare_long_gaps(self) -> int:
        """Gaps over its TBT target this request can still take with its own TBT percentile met, if
        it runs to max_tokens: k long gaps of g leave the percentile's interpolation on short ones
        while k <= (1 - percentile/100) x (g - 1). One that stops early had less room than this."""
        gaps = self.max_tokens - 1
        return math.floor(self.tbt_tolerance * (gaps - 1) + 1e-9) - self.long_gaps

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of its prompt, its outputs and, past them, this step's drafted tokens."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        return (self.prompt_token_ids + self.output_token_ids + self.draft_token_ids)[start:end]
