"""The KV blocks a step leaves free when it starts a new request: `kv_admission_watermark` of the
pool, plus a share of the output the running requests may still produce (each of its tokens takes a
slot), so that requests started now do not take the blocks the running ones will need and preempt
them. The adaptive policy takes the share from its `new_token_ratio` knob (SGLang's), the deadline
policy from what finished requests used of their limit (engine/scheduling/output_share.py)."""

from __future__ import annotations

from policies.step_builder import StepBuilder
from policies.view import SchedulerView, decode_tokens_left


def blocks_to_keep_free(step: StepBuilder, view: SchedulerView, watermark: float, output_share: float) -> int:
    if not step.running:
        return 0    # an idle engine admits anything that fits the pool, or it could stall
    if not view.waiting:
        return 0    # nothing to start: the sum over every running request, every step, is not needed
    keep = int(watermark * view.total_blocks)
    if not output_share:
        return keep
    future_tokens = sum(decode_tokens_left(s) for s in step.running)
    # with sliding layers a block of future tokens costs a page per global group (past the window the
    # sliding groups give one back for each they take)
    pages_per_block = view.kv_groups.num_full if view.kv_groups else 1
    return keep + int(output_share * future_tokens) // view.block_size * pages_per_block
