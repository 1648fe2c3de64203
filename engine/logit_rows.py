"""Which positions of a step the LM head runs at: the last one of each row that samples (plain decode and
the last prefill chunk), and, for a request that asks for prompt logprobs, every prompt position its chunk
covers (each scores the prompt token after it). Every feature that needs logits at several positions of
a row (prompt logprobs, echo, verifying drafted tokens) asks here, so the forward pass computes each row
once and only for rows that ask."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.scheduling.scheduler import ScheduledRequest


@dataclass(frozen=True)
class PromptSpan:
    request_index: int        # into the step's scheduled requests
    first_row: int            # its first row in LogitRows.positions
    targets: list[int]        # the prompt tokens those rows score, one per row


@dataclass(frozen=True)
class LogitRows:
    positions: np.ndarray     # flattened token positions the LM head runs at
    sample_rows: np.ndarray   # each sampling request's row in `positions`, in the step's order
    prompt_spans: tuple[PromptSpan, ...] = ()


def plan_logit_rows(scheduled: list[ScheduledRequest], query_starts: np.ndarray, sampling: np.ndarray) -> LogitRows:
    """`scheduled`: the step's sequences as laid out (engine.speculation.verification.layout_rows: a
    verifying decode as its decode rows); `sampling`: the indices of those that sample."""
    if not any(s.request.params.prompt_logprobs is not None and not s.is_decode for s in scheduled):
        last = (query_starts + np.array([s.num_tokens for s in scheduled], dtype=np.int64) - 1)[sampling]
        return LogitRows(last, np.arange(len(sampling), dtype=np.int64))
    samples = set(sampling.tolist())
    positions: list[int] = []
    sample_rows: list[int] = []
    spans: list[PromptSpan] = []
    for j, s in enumerate(scheduled):
        start, request = int(query_starts[j]), s.request
        if request.params.prompt_logprobs is not None and not s.is_decode:
            scored = max(0, min(s.context_len + s.num_tokens, request.num_prompt_tokens - 1) - s.context_len)
            if scored:
                targets = request.prompt_token_ids[s.context_len + 1:s.context_len + 1 + scored]
                spans.append(PromptSpan(j, len(positions), list(targets)))
                positions.extend(range(start, start + scored))
        if j in samples:
            sample_rows.append(len(positions))
            positions.append(start + s.num_tokens - 1)
    return LogitRows(np.array(positions, dtype=np.int64), np.array(sample_rows, dtype=np.int64), tuple(spans))
