"""What the engine reports: per-request deltas and one record per step."""

from __future__ import annotations

from dataclasses import dataclass


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
    prepare_s: float
    forward_s: float
    sample_s: float
    schedule_s: float
    policy: str
    knobs_version: int
