"""Drive the real Scheduler and BlockManager without a model: each step, requests that reach
their last known token get a dummy token, and finish at max_tokens. Checks invariants every step."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_cache.block_manager import BlockManager
from engine.scheduling.request import FinishReason, Request
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduleResult, Scheduler
from policies import Knobs
from policies.view import is_decode


@dataclass(frozen=True)
class Arrival:
    step: int
    prompt_len: int
    max_tokens: int


@dataclass(frozen=True)
class Change:
    step: int
    policy: str | None = None
    knobs: Knobs | None = None


@dataclass
class RunResult:
    finished: dict[str, int] = field(default_factory=dict)      # request_id -> output tokens
    steps: int = 0
    preemptions: int = 0
    scheduled_tokens: list[int] = field(default_factory=list)


def run(arrivals: list[Arrival], policy: str, knobs: Knobs, num_blocks: int, block_size: int,
        changes: list[Change] = (), max_steps: int = 3000) -> RunResult:
    blocks = BlockManager(num_blocks, block_size)
    sched = Scheduler(blocks, policy, knobs)
    pending = sorted(arrivals, key=lambda a: a.step)
    todo_changes = sorted(changes, key=lambda c: c.step)
    result = RunResult()
    step = 0
    while pending or sched.has_work():
        assert step < max_steps, f"not finished after {max_steps} steps: a request is starved or stuck"
        while pending and pending[0].step <= step:
            a = pending.pop(0)
            rid = f"r{len(result.finished) + len(sched.waiting) + len(sched.running)}-{step}-{id(a)}"
            sched.add(Request(rid, [7] * a.prompt_len, SamplingParams(max_tokens=a.max_tokens), float(step)))
        while todo_changes and todo_changes[0].step <= step:
            c = todo_changes.pop(0)
            if c.policy:
                sched.set_policy(c.policy)
            if c.knobs:
                sched.set_knobs(c.knobs)
        running_before = len(sched.running)
        res = sched.schedule()
        check_invariants(sched, res, running_before)
        sched.commit(res)
        for s in res.scheduled:
            if s.samples:
                r = s.request
                r.output_token_ids.append(9)
                if r.num_output_tokens >= r.params.max_tokens:
                    sched.finish(r, FinishReason.LENGTH)
                    result.finished[r.request_id] = r.num_output_tokens
        result.scheduled_tokens.append(sum(s.num_tokens for s in res.scheduled))
        step += 1
    result.steps = step
    result.preemptions = sched.num_preemptions
    assert blocks.num_free_blocks == blocks.num_blocks, "KV blocks leaked"
    return result


def check_invariants(sched: Scheduler, res: ScheduleResult, running_before: int) -> None:
    knobs = sched.knobs
    tokens = sum(s.num_tokens for s in res.scheduled)
    assert tokens <= knobs.token_budget, f"{tokens} tokens over budget {knobs.token_budget}"
    # lowering max_num_seqs preempts nobody, but nobody is admitted above it
    assert len(sched.running) <= max(knobs.max_num_seqs, running_before)
    held = sum(len(r.block_table) for r in sched.running)
    assert held + sched.blocks.num_free_blocks == sched.blocks.num_blocks, "KV blocks over-allocated or lost"
    assert all(not r.block_table for r in sched.waiting)
    for s in res.scheduled:
        assert len(s.request.block_table) * sched.blocks.block_size >= s.context_len + s.num_tokens
        assert s.context_len + s.num_tokens <= s.request.num_tokens
    if res.policy == "sarathi":
        scheduled = {s.request.request_id for s in res.scheduled}
        left_out = [r for r in sched.running if is_decode(r) and r.request_id not in scheduled]
        assert not left_out or tokens == knobs.token_budget, "sarathi left a decode out with budget to spare"
