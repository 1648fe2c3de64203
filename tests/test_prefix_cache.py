"""Automatic prefix caching: the pool (keys, LRU eviction, references), the scheduler with it under
random interleavings of arrivals, aborts and preemptions, and greedy output identical to no caching."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.kv_cache.block_manager import OutOfBlocksError
from engine.kv_cache.kv_groups import NULL_PAGE, KvGroups
from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
from engine.scheduling.request import FinishReason, Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import Scheduler
from policies import POLICIES, Knobs
from tests.conftest import assert_no_kv_leak, make_engine


def request(rid: str, tokens: list[int], max_tokens: int = 4, salt: str | None = None) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens), 0.0, cache_salt=salt)


def run_to_end(sched: Scheduler, requests: list[Request]) -> None:
    """Steps the scheduler as an engine would (a dummy token per sampling request) until all finish."""
    for r in requests:
        sched.add(r)
    for _ in range(500):
        if not sched.has_work():
            return
        result = sched.schedule()
        sched.commit(result)
        for s in result.scheduled:
            if s.samples:
                s.request.output_token_ids.append(5)
                if s.request.num_output_tokens >= s.request.max_tokens:
                    sched.finish(s.request, FinishReason.LENGTH)
    raise AssertionError("requests did not finish")


# -- the pool --

def test_a_second_request_reuses_the_full_blocks_of_the_first_and_computes_the_rest():
    pool = PrefixCachingBlockManager(16, 4)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    first = request("a", list(range(10, 20)))            # 2 full blocks + 2 tokens
    run_to_end(sched, [first])
    second = request("b", list(range(10, 18)) + [99, 98, 97])   # shares the 2 full blocks, then differs
    sched.add(second)
    result = sched.schedule()
    (s,) = result.scheduled
    assert (s.context_len, s.num_tokens) == (8, 3)     # only the uncached tokens are prefill work
    assert result.cache.queries == 11 and result.cache.hits == 8
    assert second.block_table[:2] == first_blocks(pool, list(range(10, 18)))


def first_blocks(pool: PrefixCachingBlockManager, tokens: list[int]) -> list[int]:
    probe = request("probe", tokens + [0])
    pool.probe(probe)
    return probe.cache.hits


def test_a_fully_cached_prompt_still_computes_its_last_block():
    pool = PrefixCachingBlockManager(16, 4)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    run_to_end(sched, [request("a", list(range(8)))])
    again = request("b", list(range(8)))
    sched.add(again)
    (s,) = sched.schedule().scheduled
    assert (s.context_len, s.num_tokens) == (4, 4) and s.samples    # capped at num_tokens - 1, floored to a block


def test_a_salt_never_finds_another_salts_blocks():
    pool = PrefixCachingBlockManager(32, 4)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    tokens = list(range(30, 42))
    run_to_end(sched, [request("a", tokens, salt="tenant-1")])
    for rid, salt, cached in (("b", "tenant-2", 0), ("c", None, 0), ("d", "tenant-1", 8)):
        r = request(rid, tokens, salt=salt)
        pool.probe(r)
        assert r.num_computed_tokens == cached, salt
    run_to_end(sched, [request("e", tokens)])                 # unsalted content is cached apart
    other = request("f", tokens, salt="tenant-2")
    pool.probe(other)
    assert other.num_computed_tokens == 0


def test_lru_eviction_takes_blocks_without_content_first_then_the_least_recently_freed():
    pool = PrefixCachingBlockManager(6, 2)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    run_to_end(sched, [request("old", [1, 2, 3, 4, 5], max_tokens=1)])    # 2 full blocks cached
    run_to_end(sched, [request("new", [6, 7, 8, 9, 10], max_tokens=1)])
    assert pool.num_cached_blocks == 4 and pool.num_free_blocks == 6
    pool.allocate(2)          # the 2 blocks that never held a full block's content go first
    assert pool.stats.evictions == 0
    pool.allocate(1)          # then the least recently freed: "old"'s tail block, its prefix after it
    old, new = request("o", [1, 2, 3, 4, 5]), request("n", [6, 7, 8, 9, 10])
    pool.probe(old), pool.probe(new)
    assert pool.stats.evictions == 1 and len(old.cache.hits) == 1 and len(new.cache.hits) == 2


def test_eviction_under_pressure_never_takes_a_block_a_running_request_holds():
    pool = PrefixCachingBlockManager(8, 2)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    run_to_end(sched, [request("a", [1, 2, 3, 4, 5, 6, 7], max_tokens=1)])
    holder = request("b", [1, 2, 3, 4, 5, 6, 9], max_tokens=8)
    sched.add(holder)
    sched.commit(sched.schedule())                     # holds a's 3 cached blocks
    held = list(holder.block_table)
    with pytest.raises(OutOfBlocksError):
        pool.allocate(pool.num_free_blocks + 1)
    pool.allocate(pool.num_free_blocks)                # everything evictable is taken...
    assert holder.block_table == held                  # ...but not what the running request holds
    probe = request("c", [1, 2, 3, 4, 5, 6, 7, 8])
    pool.probe(probe)
    assert probe.cache.hits == held[:3]


def test_preempting_a_request_that_shares_its_prefix_frees_only_its_own_blocks():
    """A and C share 4 cached blocks, B shares nothing; all three need a block in the same step with
    none free. A preempts C, which frees 1 block, not C's 5: B must not be given a block on the
    strength of C's shared ones (the scheduler would run out of blocks), and yields its own."""
    pool = PrefixCachingBlockManager(11, 2)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64))
    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    run_to_end(sched, [request("seed", shared + [9], max_tokens=1)])
    a, b, c = (request("a", shared + [20], 8), request("b", list(range(50, 59)), 8),
               request("c", shared + [30, 31], 8))
    for r in (a, b, c):
        sched.add(r)
    for _ in range(3):
        result = sched.schedule()
        sched.commit(result)
        for s in result.scheduled:
            if s.samples:
                s.request.output_token_ids.append(5)
    assert c.status is RequestStatus.PREEMPTED and b.status is RequestStatus.PREEMPTED
    assert a.block_table[:4] == first_blocks(pool, shared)
    run_to_end(sched, [])
    pool.check()
    assert pool.num_free_blocks == pool.num_blocks


# -- random interleavings (property) --

TOKENS = st.lists(st.sampled_from([3, 4]), min_size=1, max_size=24)   # two symbols: prefixes collide often
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("add"), TOKENS, st.integers(1, 6), st.sampled_from([None, "x"])),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("step"), st.integers(1, 4))), min_size=1, max_size=40)


def check_pool(pool: PrefixCachingBlockManager, sched: Scheduler) -> None:
    pool.check()
    refs: dict[int, int] = {}
    for r in sched.running:
        for block in (b for table in (r.block_table, *r.group_tables) for b in table if b != NULL_PAGE):
            refs[block] = refs.get(block, 0) + 1
        assert r.group_pages == sum(b != NULL_PAGE for t in r.group_tables for b in t)
    assert all(pool._ref_counts[b] == n for b, n in refs.items()), "a reference count differs from its holders"
    assert len(refs) + pool.num_free_blocks == pool.num_blocks, "a block is neither held nor free"
    assert all(not r.block_table and not r.group_tables for r in sched.waiting)
    check_kept_probes(pool, sched)


def check_kept_probes(pool: PrefixCachingBlockManager, sched: Scheduler) -> None:
    """A waiting request's probe is kept until a key it looked at changes: each kept answer is
    the one a probe from scratch gives now, and only waiting requests watch keys."""
    waiting = {id(r.cache) for r in sched.waiting}
    assert all(id(state) in waiting for states in pool._watchers.values() for state in states)
    for r in sched.waiting:
        if r.cache.stale:
            continue
        kept = (r.cache.hits, r.cache.group_hits, r.cache.held_hits, r.num_computed_tokens)
        r.cache.stale = True
        pool.probe(r)
        assert (r.cache.hits, r.cache.group_hits, r.cache.held_hits, r.num_computed_tokens) == kept


def test_a_kept_probe_counts_a_block_taken_by_another_admission_as_held():
    """Two waiting requests find the same cached, unheld blocks; admitting one takes them, so the
    other's kept probe must count them as held (they cost it no free block any more)."""
    pool = PrefixCachingBlockManager(32, 4)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=64, max_num_seqs=1))
    run_to_end(sched, [request("p", list(range(10, 19)))])          # 2 full blocks cached, then freed
    first, second = request("a", list(range(10, 18)) + [1, 2]), request("b", list(range(10, 18)) + [3, 4])
    sched.add(first)
    sched.add(second)
    step(sched, [first, second])
    assert first.status is RequestStatus.RUNNING and second.status is RequestStatus.WAITING
    check_kept_probes(pool, sched)    # probed before `first` took the blocks, and told that it did
    pool.probe(second)
    assert second.cache.hits and second.cache.held_hits == 2


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, policy=st.sampled_from(list(POLICIES)), block_size=st.integers(1, 4),
       spare=st.integers(0, 6), budget=st.integers(1, 32), window=st.sampled_from([None, 1, 3, 8]))
def test_no_block_leaks_under_random_arrivals_aborts_and_preemptions(actions, policy, block_size, spare, budget,
                                                                     window):
    """With `window`, pages of a global group and two sliding ones (kv_groups.py), the sliding given back."""
    groups = KvGroups.of([False, True, True], window, block_size) if window else None
    largest = groups.peak_pages(24 + 6, budget) if groups else -(-(24 + 6) // block_size)
    num_blocks = largest + spare      # the largest request fits alone, little more
    pool = PrefixCachingBlockManager(num_blocks, block_size, groups)
    sched = Scheduler(pool, policy, Knobs(token_budget=budget, max_num_seqs=8))
    live: list[Request] = []
    for i, action in enumerate(actions):
        if action[0] == "add":
            _, tokens, max_tokens, salt = action
            live.append(request(f"r{i}", tokens, max_tokens, salt))
            sched.add(live[-1])
        elif action[0] == "abort" and live:
            victim = live.pop(action[1] % len(live))
            sched.finish(victim, FinishReason.ABORT)
        else:
            for _ in range(action[1] if action[0] == "step" else 0):
                step(sched, live)
                check_pool(pool, sched)
    for _ in range(400):
        if not sched.has_work():
            break
        step(sched, live)
        check_pool(pool, sched)
    assert not sched.has_work() and pool.num_free_blocks == pool.num_blocks
    assert all(c == 0 for c in pool._ref_counts)


def step(sched: Scheduler, live: list[Request]) -> None:
    result = sched.schedule()
    groups, block_size = sched.blocks.groups, sched.blocks.block_size
    for s in result.scheduled:       # every block of the step's KV is its own or a computed, cached prefix
        end = -(-(s.context_len + s.num_tokens) // block_size)
        assert len(s.request.block_table) >= end
        if groups:                   # and every block the step's windows read is held in each group
            first = max(0, s.context_len - groups.window + 1) // block_size   # the first key this step reads
            for table, sliding in zip(s.request.group_tables, groups.group_sliding[1:]):
                assert len(table) >= end and NULL_PAGE not in table[first if sliding else 0:end]
    sched.commit(result)
    for s in result.scheduled:
        if s.samples:
            r = s.request
            r.output_token_ids.append(3)
            if r.num_output_tokens >= r.max_tokens:
                sched.finish(r, FinishReason.LENGTH)
                live.remove(r)


# -- the engine: greedy tokens with caching equal those without --

def generate_in_turns(engine, prompts: list[list[int]], max_tokens: int = 6) -> list[tuple[list[int], int]]:
    """Each prompt after the previous one finished (so later ones can hit), returning (tokens, cached)."""
    out = []
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        rid = engine.add_request(prompt, params)
        final = None
        while engine.has_unfinished():
            final = next((o for o in engine.step() if o.request_id == rid and o.finished), final)
        out.append((final.token_ids, final.num_cached_tokens))
    return out


def test_greedy_output_with_caching_is_token_identical_to_without(tiny_hf):
    path, _ = tiny_hf
    base = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]          # 3 blocks of 4
    prompts = [base,
               base,                                                   # entirely cached: the last block recomputed
               base[:10] + [40, 41, 42],                               # diverges mid-block (in the 3rd)
               base + [50, 51, 52, 53, 54],                            # extends the prompt
               [60] + base]                                            # same tokens, shifted: nothing to reuse
    cached = generate_in_turns(make_engine(path, block_size=4), prompts)
    plain = generate_in_turns(make_engine(path, block_size=4, enable_prefix_caching=False), prompts)
    assert [t for t, _ in cached] == [t for t, _ in plain]
    assert [c for _, c in cached] == [0, 8, 8, 12, 0]
    assert [c for _, c in plain] == [0] * 5


def test_concurrent_requests_sharing_a_prefix_match_and_free_everything(tiny_hf):
    """Several requests admitted while others run, sharing a prefix chunked over steps, then an abort."""
    path, _ = tiny_hf
    prefix = list(range(100, 118))
    prompts = [prefix + [120 + i] * (i + 1) for i in range(5)]
    results = {}
    for caching in (True, False):
        engine = make_engine(path, block_size=4, token_budget=8, enable_prefix_caching=caching)
        ids = [engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)) for p in prompts]
        aborted = engine.add_request(prefix + [7, 7, 7], SamplingParams(max_tokens=8, ignore_eos=True))
        tokens: dict[str, list[int]] = {}
        for n in range(400):
            if n == 6:
                engine.abort(aborted)
            for o in engine.step():
                if o.finished:
                    tokens[o.request_id] = o.token_ids
            if not engine.has_unfinished():
                break
        assert_no_kv_leak(engine)
        results[caching] = [tokens[i] for i in ids]
        if caching:
            assert engine.block_manager.stats.hits > 0
    assert results[True] == results[False]


# -- workloads, prompts and the simulator --

def test_system_prompt_and_multi_turn_workloads_share_what_they_say():
    from loadgen.workload import generate, load_workload

    system = generate(load_workload("chat-system-prompt"), num_requests=50, seed=1)
    assert {(s.prefix_group, s.prefix_tokens) for s in system} == {("chat-system-prompt/system", 500)}
    assert all(s.prompt_tokens > 500 for s in system)
    turns = generate(load_workload("multi-turn"), num_requests=200, seed=1)
    by_conversation: dict[str, list] = {}
    for s in turns:
        assert s.prefix_tokens == s.prompt_tokens
        by_conversation.setdefault(s.prefix_group, []).append(s)
    assert all(len(c) <= 8 for c in by_conversation.values())
    assert sum(len(c) >= 3 for c in by_conversation.values()) >= len(by_conversation) // 2
    for conversation in by_conversation.values():      # each turn resends the last prompt and its reply
        for before, after in zip(conversation, conversation[1:]):
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens


class CharTokenizer:
    """One token per character: enough for PromptSource, and loads in no time."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def test_bench_prompts_of_a_group_share_their_prefix_and_groups_share_nothing():
    from loadgen.bench_client import make_prompts
    from loadgen.prompts import PromptSource
    from loadgen.workload import RequestSpec

    source = PromptSource(CharTokenizer(), seed=0)
    specs = [RequestSpec(0.0, 30, 1, "x", prefix_group="g", prefix_tokens=20),
             RequestSpec(0.0, 25, 1, "x", prefix_group="g", prefix_tokens=25),
             RequestSpec(0.0, 30, 1, "x", prefix_group="h", prefix_tokens=20),
             RequestSpec(0.0, 30, 1, "x")]
    a, b, c, d = make_prompts(specs, source, text=False)
    assert [len(p) for p in (a, b, c, d)] == [30, 25, 30, 30]
    assert a[:20] == b[:20] and a[:4] != c[:4] and a[20:] != b[20:]
    assert make_prompts(specs[:1], PromptSource(source.tokenizer, seed=5), text=False)[0][:20] == a[:20]
    assert make_prompts(specs[:2], source, text=True)[1] == source.tokenizer.decode(b)


def simulated(workload: str, qps: float, caching: bool, n: int = 120):
    from loadgen.workload import generate, load_workload
    from simulation.cost_model import CostModel
    from simulation.cost_model_files import SHIPPED_COST_MODEL
    from simulation.simulator import Simulator

    cost = CostModel.load(SHIPPED_COST_MODEL)
    sim = Simulator(cost, cost.kv_blocks, cost.block_size, "deadline", Knobs(token_budget=512),
                    prefix_caching=caching)
    records, steps = [], []
    sim.finish_listeners.append(records.append)
    sim.step_listeners.append(steps.append)
    sim.submit(generate(load_workload(workload), qps=qps, num_requests=n, seed=0))
    sim.run()
    return records, steps, sim


def test_the_simulator_prices_only_uncached_prompt_tokens():
    records, steps, sim = simulated("chat-system-prompt", 0.2, caching=True)
    plain_records, plain_steps, _ = simulated("chat-system-prompt", 0.2, caching=False)
    prompt = sum(r.num_prompt_tokens for r in records)
    hits = sum(s.prefix_cache_hits for s in steps)
    assert sum(s.prefix_cache_queries for s in steps) == prompt
    assert hits == sum(r.num_cached_tokens for r in records) and hits > 0.7 * 500 * len(records)
    assert sum(s.num_prefill_tokens for s in steps) == prompt - hits        # no preemption at this load
    assert sum(s.num_prefill_tokens for s in plain_steps) == prompt
    assert sim.blocks.num_free_blocks == sim.blocks.num_blocks
    ttft = sorted(r.ttft_s for r in records)[len(records) // 2]
    plain_ttft = sorted(r.ttft_s for r in plain_records)[len(records) // 2]
    assert ttft < 0.6 * plain_ttft


def test_without_shared_prefixes_the_simulator_runs_as_without_caching():
    records, steps, _ = simulated("chat", 0.3, caching=True, n=60)
    plain, _, _ = simulated("chat", 0.3, caching=False, n=60)
    assert [(r.first_token, r.finished) for r in records] == [(r.first_token, r.finished) for r in plain]
    # its requests are not hashed (nothing to share) but count as lookups that missed, as in the engine
    assert sum(s.prefix_cache_queries for s in steps) == sum(r.num_prompt_tokens for r in records)
    assert sum(s.prefix_cache_hits for s in steps) == 0


# -- telemetry and the tuner's context --

def test_prometheus_and_the_window_report_hits_queries_and_evictions():
    from telemetry.prometheus import PrometheusMetrics
    from telemetry.window import TelemetryWindow

    _, steps, _ = simulated("chat-system-prompt", 0.2, caching=True, n=30)
    metrics, window = PrometheusMetrics("m"), TelemetryWindow(clock=lambda: 1e9)
    for s in steps:
        metrics.on_step(s)
        window.on_step(s)
    sample = lambda name: metrics.registry.get_sample_value(f"autotuned:{name}", {"model_name": "m"})  # noqa: E731
    queries, hits = sum(s.prefix_cache_queries for s in steps), sum(s.prefix_cache_hits for s in steps)
    assert (sample("prefix_cache_queries_total"), sample("prefix_cache_hits_total")) == (queries, hits)
    assert sample("prefix_cache_blocks") == steps[-1].prefix_cache_blocks > 0
    assert sample("prefix_cache_evictions_total") == sum(s.prefix_cache_evictions for s in steps)
    assert window.window(2e9).prefix_cache_hit_rate == pytest.approx(hits / queries)


def test_a_mostly_cached_workload_is_its_own_regime_and_turning_cached_is_a_drift():
    from autotuner.regime import DriftDetector, Regime, WorkloadContext

    plain = WorkloadContext(2.0, 1.0, 0.3, None)
    cached = WorkloadContext(2.0, 1.0, 0.3, 0.8)
    assert Regime.of(plain).key == "io=2^1|rate=2^0|kv=low"           # as before prefix caching
    assert Regime.of(cached).key == "io=2^1|rate=2^0|kv=low|cache=high"
    assert Regime.of(WorkloadContext(2.0, 1.0, 0.3, 0.3)).cache == "none"
    detector = DriftDetector()
    detector.update(plain.signals())
    assert not any(detector.update(WorkloadContext(2.0, 1.0, 0.3, 0.1).signals()) for _ in range(20))
    assert any(detector.update(cached.signals()) for _ in range(2))
