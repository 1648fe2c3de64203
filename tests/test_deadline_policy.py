"""The deadline policy against a fixed step-time model: steps fit the tightest TBT slack, a late
request shrinks the next step, the error budget is never overspent, and EDF order bounds how long
a batch request can be passed."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv_cache.block_manager import BlockManager
from simulation.cost_model import CostModel
from engine.scheduling.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduledRequest, ScheduleResult, Scheduler
from engine.slo_class import SloClass
from policies import Knobs, SchedulerView
from policies.deadline import DeadlinePolicy, StepTime

# 20 ms a step + 1 ms a token + 0.1 ms a sequence + a little per context token and per attended
# (query, key) pair (1 ms per million, so a mispriced chunk shows): linear, so the numbers below can
# be checked by hand
COST = CostModel((0.02, 1e-3, 0.0, 0.0, 1e-6, 1e-9, 1e-4))
INTERACTIVE = SloClass("interactive", 2.0, 0.25)
BATCH = SloClass("batch", 30.0, 2.0)
NOW = 100.0
POLICY = DeadlinePolicy()


def decode(i: int, since_last_token: float, prompt: int = 50, slo: SloClass = INTERACTIVE,
           max_tokens: int = 512) -> Request:
    """A running decode; at 512 tokens its own P99 gap tolerates 5 long gaps."""
    r = Request(f"d{i}", [7] * prompt, SamplingParams(max_tokens=max_tokens), NOW - 10, slo=slo)
    r.output_token_ids = [9]
    r.num_computed_tokens = prompt
    r.block_table = list(range(-(-(prompt + 1) // 16)))
    r.timings.token_times.append(NOW - since_last_token)
    return r


def waiting(i: int, prompt: int, arrived_ago: float = 0.0, slo: SloClass = INTERACTIVE) -> Request:
    return Request(f"w{i}", [7] * prompt, SamplingParams(max_tokens=16), NOW - arrived_ago, slo=slo)


def view(running, queue, tolerated: float = 0.0, long: int = 0, cost=COST) -> SchedulerView:
    return SchedulerView(running, queue, free_blocks=10_000, total_blocks=10_000, block_size=16, now=NOW,
                         cost=cost, tolerated_long_gaps=tolerated, long_gaps=long)


def by_hand(chunks: list[tuple[Request, int]]) -> float:
    """COST of a step giving each request n new tokens, its shape counted from the definitions, not
    with the code under test: new token i (1..n) of a request with c tokens cached attends to c + i
    keys; the step reads c + n tokens of its KV cache; it samples when c + n reaches its last token."""
    prefill = decode = sampled = context = pairs = 0
    for seq, n in chunks:
        c = seq.num_computed_tokens
        if n == 1 and c >= seq.num_prompt_tokens:
            decode += 1
        else:
            prefill += n
        sampled += c + n == seq.num_tokens
        context += c + n
        pairs += sum(c + i for i in range(1, n + 1))
    return COST.predict_counts(prefill, decode, sampled, context, pairs, len(chunks))


def predicted(v: SchedulerView, plan) -> float:
    """The plan's step time under COST, its shape counted by hand."""
    by_id = {s.request_id: s for s in [*v.running, *v.waiting]}
    return by_hand([(by_id[chunk.request_id], chunk.num_tokens) for chunk in plan.scheduled])


def prefill_tokens(plan) -> int:
    return sum(c.num_tokens for c in plan.scheduled if c.request_id.startswith("w"))


@settings(max_examples=200, deadline=None)
@given(since=st.lists(st.floats(0.0, 0.4), min_size=0, max_size=12),
       prompts=st.lists(st.integers(1, 3000), min_size=1, max_size=6),
       headroom=st.floats(0.5, 1.5), budget=st.integers(1, 4096))
def test_step_fits_the_tightest_slack_or_carries_no_prefill(since, prompts, headroom, budget):
    running = [decode(i, s) for i, s in enumerate(since)]
    v = view(running, [waiting(i, p) for i, p in enumerate(prompts)])
    knobs = Knobs(token_budget=budget, step_headroom=headroom, error_budget=0.0, prefill_priority=0.0)
    plan = POLICY.plan(v, knobs)
    assert plan.num_tokens <= budget
    scheduled_decodes = [r for r in running if r.request_id in {c.request_id for c in plan.scheduled}]
    assert len(scheduled_decodes) == min(len(running), budget)          # decodes first, all that fit
    if not scheduled_decodes:
        return                                                        # no slack to respect
    target = headroom * min(0.25 - (NOW - r.last_token_time) for r in scheduled_decodes)
    if prefill_tokens(plan):
        assert predicted(v, plan) <= target + 1e-9
    else:   # either nothing more fits, or the decodes alone already overrun the target
        assert plan.num_tokens == budget or by_hand([(r, 1) for r in scheduled_decodes] + [(v.waiting[0], 1)]) > target


class Recording:
    """A step-time model that records the shapes it is asked about."""

    tile_tokens = 1

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def predict_counts(self, *counts: int) -> float:
        self.shapes.append(counts)
        return 0.0


def two_decodes_and_two_chunks() -> tuple[list[Request], Request, Request]:
    """Two decodes at context 50 (each reads 51 tokens, 51 pairs), the first 100 tokens of a
    2000-token prompt (100 tokens, 1 + 2 + ... + 100 = 5050 pairs) and the last 100 of another
    (2000 tokens read, 100 x 1900 + 5050 = 195050 pairs, and it samples)."""
    last = waiting(1, 2000)
    last.num_computed_tokens = 1900
    return [decode(0, 0.0), decode(1, 0.0)], waiting(0, 2000), last


def test_step_time_prices_the_shape_counted_by_hand():
    decodes, first, last = two_decodes_and_two_chunks()
    model = Recording()
    time = StepTime(model)
    time.add_decodes(decodes, NOW)
    time.with_chunk(first, 100)
    time.add_chunk(first, 100)
    time.with_chunk(last, 100)
    # (prefill, decode, sampled, context, pairs, seqs)
    assert model.shapes == [(100, 2, 2, 102 + 100, 102 + 5050, 3),
                            (200, 2, 3, 102 + 100 + 2000, 102 + 5050 + 195050, 4)]


def test_the_scheduler_records_the_shape_counted_by_hand():
    decodes, first, last = two_decodes_and_two_chunks()
    result = ScheduleResult.of([ScheduledRequest(first, 100, 0), ScheduledRequest(decodes[0], 1, 50),
                                ScheduledRequest(last, 100, 1900)], 0, Knobs(), "deadline")
    assert [s.request for s in result.scheduled] == [decodes[0], first, last]     # decodes first
    assert (result.num_decode_tokens, result.num_tokens, result.num_sampled) == (1, 201, 2)
    assert (result.context_tokens, result.attended_pairs) == (51 + 100 + 2000, 51 + 5050 + 195050)


def test_a_late_request_shrinks_the_next_step():
    queue = [waiting(0, 2000)]
    on_time = POLICY.plan(view([decode(0, 0.0), decode(1, 0.0)], queue), Knobs(token_budget=4096))
    late = POLICY.plan(view([decode(0, 0.0), decode(1, 0.15)], queue), Knobs(token_budget=4096))
    # target 0.9 x 0.25 s = 225 ms: 20 + 0.2 + ~0.1 ms of decodes leave ~204 prefill tokens
    assert 150 < prefill_tokens(on_time) < 225
    # 0.9 x (0.25 - 0.15) = 90 ms: about 69 tokens
    assert 0 < prefill_tokens(late) < 0.5 * prefill_tokens(on_time)
    overdue = POLICY.plan(view([decode(0, 0.0), decode(1, 0.3)], queue), Knobs(token_budget=4096))
    assert prefill_tokens(overdue) == 0 and overdue.num_tokens == 2


def test_no_decode_running_lets_the_budget_alone_cap_the_step():
    plan = POLICY.plan(view([], [waiting(0, 1500)]), Knobs(token_budget=1024))
    assert prefill_tokens(plan) == 1024


def part_way(i: int, prompt: int, computed: int, arrived_ago: float, slo: SloClass = BATCH) -> Request:
    """A prompt part-way through its prefill."""
    r = Request(f"p{i}", [7] * prompt, SamplingParams(max_tokens=16), NOW - arrived_ago, slo=slo)
    r.num_computed_tokens = computed
    r.block_table = list(range(-(-computed // 16)))
    return r


def test_full_partial_slots_let_the_partial_prompts_run_while_a_new_one_due_first_waits():
    """Two batch prompts part-way (due in 25 and 29 s) fill max_partial_prefills; an interactive
    prompt due in 1.5 s cannot start. The step goes on with the partial ones (it used to schedule
    nothing, every step: a deadlock, as the slots never freed)."""
    running = [part_way(0, 3000, 1000, arrived_ago=5.0), part_way(1, 2000, 208, arrived_ago=1.0)]
    plan = POLICY.plan(view(running, [waiting(0, 500, arrived_ago=0.5)]), Knobs(token_budget=512, max_partial_prefills=2))
    assert [(c.request_id, c.num_tokens) for c in plan.scheduled] == [("p0", 512)]
    both = POLICY.plan(view(running, [waiting(0, 500, arrived_ago=0.5)]), Knobs(token_budget=4096, max_partial_prefills=2))
    assert [c.request_id for c in both.scheduled] == ["p0", "p1"]                  # still no new prompt
    freed = POLICY.plan(view(running, [waiting(0, 500, arrived_ago=0.5)]), Knobs(token_budget=512, max_partial_prefills=3))
    assert [c.request_id for c in freed.scheduled][0] == "w0"                      # a slot: deadline order


def test_batch_decodes_let_steps_grow_toward_their_target():
    queue = [waiting(0, 3000, slo=BATCH)]
    interactive = prefill_tokens(POLICY.plan(view([decode(0, 0.0)], queue), Knobs(token_budget=4096)))
    batch = prefill_tokens(POLICY.plan(view([decode(0, 0.0, slo=BATCH)], queue), Knobs(token_budget=4096)))
    assert batch > 5 * interactive


def test_error_budget_rescues_a_prompt_at_risk_and_is_never_overspent():
    # 1.3 s to its deadline with 1200 tokens to go: at ~200 tokens a step (~0.225 s) it needs 6 steps,
    # 1.35 s, too many; one whole step takes ~1.23 s and makes it
    queue = [waiting(0, 1200, arrived_ago=0.7)]
    running = [decode(i, 0.0) for i in range(3)]
    knobs = Knobs(token_budget=4096, error_budget=1.0)
    none_left = POLICY.plan(view(running, queue, tolerated=5.0, long=3), knobs)
    assert prefill_tokens(none_left) < 1200          # 5 - 3 = 2 < the 3 decodes it would make late
    paid = POLICY.plan(view(running, queue, tolerated=5.0, long=2), knobs)
    assert prefill_tokens(paid) == 1200
    half = POLICY.plan(view(running, queue, tolerated=5.0, long=2), knobs.replace(error_budget=0.5))
    assert prefill_tokens(half) < 1200               # floor(0.5 x 5) - 2 = 0


def test_a_rescue_never_costs_a_decode_its_own_tbt_percentile():
    queue = [waiting(0, 1200, arrived_ago=0.7)]                     # as above: paid for by the window's budget
    knobs = Knobs(token_budget=4096, error_budget=1.0)
    short = [decode(0, 0.0), decode(1, 0.0, max_tokens=64)]         # 63 gaps: its P99 takes no long one
    assert prefill_tokens(POLICY.plan(view(short, queue, tolerated=5.0), knobs)) < 1200
    spent = [decode(0, 0.0), decode(1, 0.0)]
    spent[1].long_gaps = 5                                          # 511 gaps tolerate 5, all taken
    assert prefill_tokens(POLICY.plan(view(spent, queue, tolerated=5.0), knobs)) < 1200
    assert prefill_tokens(POLICY.plan(view([decode(0, 0.0), decode(1, 0.0)], queue, tolerated=5.0), knobs)) == 1200


def test_a_rescue_step_stays_within_the_arrival_guard():
    queue = [waiting(0, 1200, arrived_ago=0.7)]
    running = [decode(i, 0.0) for i in range(3)]
    knobs = Knobs(token_budget=4096, error_budget=1.0)
    guarded = view(running, queue, tolerated=5.0)
    guarded = SchedulerView(**{**guarded.__dict__, "arrival_guard_s": 1.0})   # ~1.23 s would rescue it whole
    plan = POLICY.plan(guarded, knobs)
    assert prefill_tokens(plan) < 1200 and predicted(guarded, plan) <= 1.0


def test_a_prompt_longer_than_the_cap_is_rescued_one_capped_step_at_a_time():
    # a 6000-token batch prompt with 7 s to its deadline behind a decode 0.15 s into its gap: the
    # slack-sized pace (~70 tokens in 0.09 s) needs ~8 s; 2048-token steps (~2.07 s) need ~6.2 s
    queue = [waiting(0, 6000, arrived_ago=23.0, slo=BATCH)]
    running = [decode(0, 0.15)]
    knobs = Knobs(token_budget=2048, error_budget=1.0)
    assert prefill_tokens(POLICY.plan(view(running, queue, tolerated=5.0, long=0), knobs)) == 2047  # the cap less the decode
    assert prefill_tokens(POLICY.plan(view(running, queue, tolerated=5.0, long=5), knobs)) < 2048
    hopeless = [waiting(0, 6000, arrived_ago=25.0, slo=BATCH)]      # 5 s left: even capped steps miss it
    assert prefill_tokens(POLICY.plan(view(running, hopeless, tolerated=5.0), knobs)) < 2048


def test_a_lost_cause_spends_nothing():
    queue = [waiting(0, 4000, arrived_ago=1.9)]      # no step can give it a first token by its deadline
    plan = POLICY.plan(view([decode(0, 0.0)], queue, tolerated=100.0), Knobs(token_budget=8192, error_budget=1.0))
    assert prefill_tokens(plan) < 4000


def test_prefill_priority_is_a_floor_under_decode_overload():
    running = [decode(i, 0.3) for i in range(4)]     # all late: deadlines alone leave no prefill
    queue = [waiting(0, 500)]
    assert prefill_tokens(POLICY.plan(view(running, queue), Knobs(token_budget=256))) == 0
    assert prefill_tokens(POLICY.plan(view(running, queue), Knobs(token_budget=256, prefill_priority=0.25))) == 64


def test_tile_multiples_where_cheaper_per_token():
    # a GPU-like model: the linear layers cost per started 128-token tile
    class Tiled:
        tile_tokens = 128

        def predict_counts(self, prefill, decode, sampled, context, pairs, seqs):
            return 0.005 + 0.004 * math.ceil((prefill + decode) / 128)
    v = view([], [waiting(0, 1000)], cost=Tiled())
    assert prefill_tokens(POLICY.plan(v, Knobs(token_budget=300))) == 256
    assert prefill_tokens(POLICY.plan(view([], [waiting(0, 200)], cost=Tiled()), Knobs(token_budget=300))) == 200


def test_without_a_cost_model_it_is_sarathi_in_deadline_order():
    queue = [waiting(0, 100, slo=BATCH, arrived_ago=5.0), waiting(1, 100)]   # deadlines NOW+25, NOW+2
    plan = POLICY.plan(view([decode(0, 0.0)], queue, cost=None), Knobs(token_budget=150))
    assert [c.request_id for c in plan.scheduled] == ["d0", "w1", "w0"]
    assert plan.num_tokens == 150


arrivals = st.lists(st.tuples(st.floats(0, 60), st.sampled_from(["interactive", "batch"]), st.integers(16, 400)),
                    min_size=2, max_size=40)


@settings(max_examples=60, deadline=None)
@given(arrivals=arrivals)
def test_batch_requests_are_passed_only_by_requests_due_earlier(arrivals):
    """Whoever is admitted first, no waiting request had an earlier deadline; so a batch request is
    never passed by an interactive one that arrived more than 30 - 2 = 28 s after it."""
    classes = {"interactive": INTERACTIVE, "batch": BATCH}
    clock = [0.0]
    sched = Scheduler(BlockManager(64, 16), "deadline", Knobs(token_budget=256, max_num_seqs=4), clock=lambda: clock[0])
    sched.cost = COST
    pending = sorted(arrivals)
    admitted_at: dict[str, float] = {}
    requests: dict[str, Request] = {}
    for step in range(5000):
        while pending and pending[0][0] <= clock[0]:
            t, name, prompt = pending.pop(0)
            r = Request(f"r{len(requests)}", [7] * prompt, SamplingParams(max_tokens=8), t, slo=classes[name])
            requests[r.request_id] = r
            sched.add(r)
        if not sched.has_work():
            if not pending:
                break
            clock[0] = pending[0][0]
            continue
        waiting_before = list(sched.waiting)
        result = sched.schedule()
        for request_id in [s.request.request_id for s in result.scheduled if s.request.request_id not in admitted_at]:
            admitted_at[request_id] = clock[0]
            admitted = requests[request_id]
            passed = [w for w in waiting_before if w.request_id not in admitted_at and w is not admitted]
            assert all(w.ttft_deadline >= admitted.ttft_deadline for w in passed)
        clock[0] += COST.predict_counts(result.num_tokens - result.num_decode_tokens, result.num_decode_tokens,
                                        result.num_sampled, result.context_tokens, result.attended_pairs,
                                        len(result.scheduled))
        sched.commit(result)
        for s in result.scheduled:
            if s.samples:
                s.request.output_token_ids.append(9)
                s.request.timings.token_times.append(clock[0])
                if s.request.num_output_tokens >= 8:
                    from engine.scheduling.request import FinishReason
                    sched.finish(s.request, FinishReason.LENGTH)
    assert not pending and not sched.has_work(), "a request starved"


def test_error_budget_counts_gaps_over_each_class_target_and_forgets_past_its_horizon():
    from engine.scheduling.error_budget import ErrorBudget
    budget = ErrorBudget(horizon_s=60.0)
    fast, slow = decode(0, 0.0), decode(1, 0.0, slo=BATCH)
    fast.timings.token_times[-1] = slow.timings.token_times[-1] = 0.0
    budget.observe([fast, slow], now=0.5)            # 0.5 s: long for interactive, fine for batch
    tolerated, long = budget.state(0.5)
    assert long == 1 and math.isclose(tolerated, 0.02)
    first = Request("new", [7], SamplingParams(max_tokens=4))
    budget.observe([first], now=1.0)                 # a first token is TTFT, not a gap
    assert budget.state(1.0)[1] == 1
    assert budget.state(61.0) == (0.0, 0)


def test_ttft_pace_keeps_steps_short_while_deadlines_are_far_and_lets_them_grow_when_near():
    running = [decode(0, 0.0), decode(1, 0.0)]
    unpaced = prefill_tokens(POLICY.plan(view(running, [waiting(0, 200)]), Knobs(token_budget=4096)))
    assert 150 < unpaced < 225                                        # the whole 225 ms target, as above
    paced = Knobs(token_budget=4096, ttft_pace=2.0)
    # 200 tokens due in 2 s, twice as fast: 200 tokens/s, a few tokens a ~20 ms step: the smallest paced chunk
    assert prefill_tokens(POLICY.plan(view(running, [waiting(0, 200)]), paced)) == 32
    # eight such prompts at pace 1: 800 tokens/s; P / (20.3 ms + 1 ms x P) = 800 at P ~ 81
    queue = [waiting(i, 200) for i in range(8)]
    assert 70 < prefill_tokens(POLICY.plan(view(running, queue), Knobs(token_budget=4096, ttft_pace=1.0))) < 95
    # due in 0.2 s: no pace is fast enough, so the slack alone sizes the step again
    near = prefill_tokens(POLICY.plan(view(running, [waiting(0, 200, arrived_ago=1.8)]), paced))
    assert near == unpaced


@given(partial=st.lists(st.integers(0, 3), max_size=5), waiting=st.lists(st.integers(0, 3), max_size=8))
def test_candidates_are_in_deadline_order_partial_prompts_first_on_a_tie(partial, waiting):
    """candidates_of's sort and insertion give what one stable sort of partial then waiting gives."""
    from types import SimpleNamespace

    from policies.deadline import candidates_of

    partial_seqs = [SimpleNamespace(ttft_deadline=float(d), name=f"p{i}") for i, d in enumerate(partial)]
    waiting_seqs = [SimpleNamespace(ttft_deadline=float(d), name=f"w{i}") for i, d in enumerate(waiting)]
    step = SimpleNamespace(partial_prefills=lambda: list(partial_seqs))
    ordered, partial_ids = candidates_of(step, SimpleNamespace(waiting=waiting_seqs))
    expected = sorted(partial_seqs + waiting_seqs, key=lambda s: s.ttft_deadline)
    assert [s.name for s in ordered] == [s.name for s in expected]
    assert partial_ids == {id(s) for s in partial_seqs}


def test_a_new_prompt_waits_while_the_running_requests_output_would_not_fit_the_pool_beside_it():
    """Two decodes with 480 output tokens left each (30 blocks of 16 apiece): where finished requests
    used all of their max_tokens, a 64-token prompt (4 blocks) is started only if 60 blocks stay free
    for them; where they used a tenth, 6 blocks are kept."""
    running = [decode(0, 0.0, max_tokens=481), decode(1, 0.0, max_tokens=481)]
    queue = [waiting(0, 64)]

    def admitted(free_blocks: int, share: float) -> bool:
        v = SchedulerView(running, queue, free_blocks=free_blocks, total_blocks=1000, block_size=16, now=NOW,
                          cost=COST, output_share=share)
        return bool(POLICY.plan(v, Knobs(kv_admission_watermark=0.0)).admitted)

    assert not admitted(63, 1.0) and admitted(64, 1.0)
    assert not admitted(9, 0.1) and admitted(10, 0.1)
    assert admitted(4, 0.0)


def test_the_output_share_is_learned_from_requests_that_finished_on_their_own():
    from engine.scheduling.output_share import MIN_FINISHED, OutputShare
    share = OutputShare()
    for _ in range(MIN_FINISHED - 1):
        share.observe(100, 100)
    assert share.value == 0.0              # too few finished: nothing kept
    share.observe(100, 100)
    assert share.value == 1.0
    for _ in range(400):                   # a chat client stopping at EOS, a tenth of its limit
        share.observe(200, 2048)
    assert 0.09 < share.value < 0.1
