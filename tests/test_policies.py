"""Every policy, over random arrivals, lengths, pool sizes and knobs, keeps the scheduler's invariants
(budget, sequence limit, KV accounting), finishes every request, and survives knob/policy changes."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import POLICIES, Knobs
from tests.scheduler_harness import Arrival, Change, run

arrivals = st.lists(st.builds(Arrival, step=st.integers(0, 30), prompt_len=st.integers(1, 60),
                              max_tokens=st.integers(1, 20)), min_size=1, max_size=16)


@st.composite
def knobs(draw) -> Knobs:
    high = draw(st.floats(0.3, 1.0))
    return Knobs(token_budget=draw(st.integers(1, 128)), max_num_seqs=draw(st.integers(1, 16)),
                 prefill_priority=draw(st.floats(0, 1)), max_partial_prefills=draw(st.integers(1, 4)),
                 long_prefill_token_threshold=draw(st.sampled_from([0, 1, 8, 32])),
                 kv_admission_watermark=draw(st.floats(0, 0.5)), new_token_ratio=draw(st.floats(0, 1)),
                 kv_high_watermark=high, kv_low_watermark=draw(st.floats(0, high)),
                 queue_order=draw(st.sampled_from(["fcfs", "spf"])))


def pool_size(data: st.DataObject, reqs: list[Arrival], block_size: int) -> int:
    """At least what the largest request needs alone (the engine rejects anything bigger)."""
    need = max(-(-(a.prompt_len + a.max_tokens) // block_size) for a in reqs)
    return data.draw(st.integers(need, need * 4))


# derandomize: the same examples every run, so CI judges the code, not the draw (a random draw in
# CI once found the prefill-first thrash that test_prefill_first_does_not_thrash_... now pins down).
SETTINGS = settings(max_examples=int(os.environ.get("POLICY_EXAMPLES", "100")), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy", list(POLICIES))
@SETTINGS
@given(reqs=arrivals, k=knobs(), block_size=st.integers(1, 8), data=st.data())
def test_invariants_hold_and_every_request_finishes(policy, reqs, k, block_size, data):
    result = run(reqs, policy, k, pool_size(data, reqs, block_size), block_size)
    assert sorted(result.finished.values()) == sorted(a.max_tokens for a in reqs)


@SETTINGS
@given(reqs=arrivals, first=knobs(), second=knobs(), block_size=st.integers(1, 8), data=st.data(),
       policies=st.lists(st.sampled_from(list(POLICIES)), min_size=2, max_size=4))
def test_knob_and_policy_changes_mid_run_lose_nothing(reqs, first, second, block_size, data, policies):
    changes = [Change(step=5 * i + 1, policy=p, knobs=second if i % 2 else first) for i, p in enumerate(policies[1:])]
    result = run(reqs, policies[0], first, pool_size(data, reqs, block_size), block_size, changes)
    assert sorted(result.finished.values()) == sorted(a.max_tokens for a in reqs)


def test_small_pool_forces_preemption_and_recovers():
    reqs = [Arrival(0, 30, 20) for _ in range(6)]
    result = run(reqs, "sarathi", Knobs(token_budget=64), num_blocks=20, block_size=4)
    assert result.preemptions > 0 and len(result.finished) == 6


def test_prefill_first_does_not_thrash_under_recompute_preemption():
    """Found by a random draw: admitting a prompt on its first chunk's KV alone let a preempted
    request be re-admitted, refill the pool and be preempted again (118 preemptions, 3432 steps
    for 600 steps of work). A prompt now starts only when all of it fits, as in vLLM v0."""
    reqs = [Arrival(15, 40, 5), Arrival(0, 48, 20), Arrival(12, 43, 14), Arrival(11, 20, 5), Arrival(9, 32, 9),
            Arrival(12, 46, 20), Arrival(7, 51, 15), Arrival(25, 60, 7), Arrival(22, 12, 16), Arrival(24, 30, 2),
            Arrival(23, 59, 14), Arrival(6, 34, 10)]
    result = run(reqs, "prefill-first", Knobs(token_budget=1, max_num_seqs=4), num_blocks=127, block_size=1)
    assert len(result.finished) == len(reqs) and result.steps <= 700 and result.preemptions <= 2


def test_prefill_first_never_mixes_and_orca_does():
    reqs = [Arrival(i * 3, 20, 10) for i in range(6)]
    for policy, expect_mixed in (("prefill-first", False), ("orca", True), ("sarathi", True)):
        from tests.scheduler_harness import run as run_
        mixed = []
        import engine.scheduling.scheduler as es
        original = es.Scheduler.schedule

        def spy(self, _orig=original):
            res = _orig(self)
            kinds = {s.context_len >= s.request.num_prompt_tokens for s in res.scheduled}
            mixed.append(len(kinds) == 2)
            return res
        es.Scheduler.schedule = spy
        try:
            run_(reqs, policy, Knobs(token_budget=64), num_blocks=200, block_size=4)
        finally:
            es.Scheduler.schedule = original
        assert any(mixed) == expect_mixed, policy


def test_invalid_knobs_are_rejected_with_a_message():
    with pytest.raises(ValueError, match="token_budget=0 must be an integer in"):
        Knobs(token_budget=0)
    with pytest.raises(ValueError, match="queue_order='lifo' must be one of fcfs, spf"):
        Knobs(queue_order="lifo")
    with pytest.raises(ValueError, match="unknown knob"):
        Knobs().replace(chunk=3)
    with pytest.raises(ValueError, match="kv_low_watermark 0.95 is above"):
        Knobs(kv_low_watermark=0.95)
    assert Knobs().replace(token_budget=64).version == 1
