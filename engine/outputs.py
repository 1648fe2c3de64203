"""What the engine reports: per-request deltas and one record per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:          # a leaf imports nothing of the engine's at run time
    from engine.logprobs import TokenLogprob


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]
    text_delta: str
    text: str                     # all output text so far
    token_ids: list[int]          # all output tokens so far
    num_prompt_tokens: int
    finished: bool
    finish_reason: str | None     # "stop", "length", "abort", "error"
    num_cached_tokens: int = 0    # prompt tokens whose KV its admission found in the prefix cache
    logprobs: tuple[TokenLogprob, ...] = ()          # one per new token, where the request asks for logprobs
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None   # its prompt tokens after the first, with its first output


@dataclass(frozen=True)
class StepRecord:
    """The only per-step facts telemetry needs from the engine."""

    step: int
    start: float                  # time.monotonic() at step start
    duration_s: float
    num_prefill_tokens: int
    num_decode_tokens: int
    num_prefill_seqs: int
    num_running: int
    num_waiting: int
    num_preempted: int
    kv_usage: float
    context_tokens: int           # tokens attended to (KV read) summed over sequences
    attended_pairs: int           # (query, key) pairs attention computed, summed over sequences
    num_sampled: int              # sequences that produced a token (rows through the LM head)
    prepare_s: float
    forward_s: float
    sample_s: float
    schedule_s: float
    policy: str
    knobs_version: int
    token_gaps: tuple[float, ...] = ()   # for each token this step produced after a request's first: the gap
                                         # since that request's previous token (TBT, within this step's window)
    prefix_cache_queries: int = 0     # tokens of requests first admitted this step (vLLM's prefix_cache_queries)
    prefix_cache_hits: int = 0        # ... of them found in the prefix cache
    prefix_cache_evictions: int = 0   # cached blocks reused for other content this step
    prefix_cache_blocks: int = 0      # blocks holding findable content after scheduling (0: caching off)
    head_rows: int = 0                # rows through the LM head: the sampled ones plus prompt positions scored
                                      # for prompt logprobs (0 in records made before it was counted)
    grammar_rows: int = 0             # sampled rows held to a grammar (their masks filled during the forward)
    mask_s: float = 0.0               # time filling those masks
    forced_tokens: int = 0            # tokens the grammars forced this step (jump-forward), emitted unsampled
    draft_tokens: int = 0             # drafted tokens verified (speculative decoding), among num_decode_tokens
    kept_draft_tokens: int = 0        # ... of them accepted
    draft_seqs: int = 0               # decodes that verified drafts


@dataclass(frozen=True)
class GrammarStep:
    """A step's constrained-decoding facts, for its StepRecord."""

    rows: int = 0
    mask_s: float = 0.0
    forced_tokens: int = 0


@dataclass(frozen=True)
class DraftStep:
    """A step's speculative-decoding facts, for its StepRecord."""

    drafted: int = 0
    kept: int = 0
    seqs: int = 0


@dataclass(frozen=True)
class RequestRecord:
    """A finished request's timings and sizes: the only per-request facts telemetry needs."""

    request_id: str
    arrival: float                # time.monotonic() clock, like StepRecord.start
    first_token: float | None
    finished: float
    token_times: tuple[float, ...]     # one per emission (engine/scheduling/request.py: RequestTimings)
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    finish_reason: str
    num_preemptions: int
    slo_class: str = "interactive"
    slo_ttft_s: float | None = None     # the class's targets (None: judge by the reader's SLO)
    slo_tbt_s: float | None = None
    num_cached_tokens: int = 0          # prompt tokens found in the prefix cache at admission
    constrained: bool = False           # its output was held to a grammar

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e_s(self) -> float:
        return self.finished - self.arrival

    @property
    def tbt_s(self) -> list[float]:
        """Gaps between consecutive emissions (TBT / ITL): a step that emits several tokens is one gap."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Mean decode time per output token after the first: first token to finish over the tokens after the
        first (a step that emits several tokens counts each)."""
        if self.first_token is None or self.num_output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.num_output_tokens - 1)
