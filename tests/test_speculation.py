"""Speculative decoding: the drafter, the priced choice of lengths, verification that keeps outputs exact
(greedy tokens, seeded samples, the sampled distribution), and the KV of rejected drafts given back."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from engine.kv_cache.block_manager import BlockManager
from engine.kv_cache.kv_groups import KvGroups
from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
from engine.sampling_params import SamplingParams
from engine.scheduling.request import FinishReason, Request
from engine.scheduling.scheduler import ScheduledRequest, Scheduler
from engine.speculation.acceptance import AcceptanceTracker
from engine.speculation.ngram_drafter import NgramDrafter, NgramIndex, Tokens
from engine.speculation.speculator import Speculator
from engine.speculation.verification import kept_drafts, layout_rows
from policies import Knobs
from policies.deadline import StepTime
from policies.draft_lengths import DraftOffer, priced_lengths
from simulation.cost_model import CostModel
from simulation.speculation_model import SimulatedDrafter, SpeculationModel, workload_speculation
from simulation.verify_rows import ROWS as VERIFY_ROWS, VerifyRows, measure_verify_rows
from tests.conftest import assert_no_kv_leak, make_engine
from tests.test_prefix_cache import ACTIONS, check_pool

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [10, 11, 12, 13, 14, 10, 11, 12],
           list(range(20, 29)) + [20, 21], list(range(30, 60)) + list(range(30, 40))]


# -- the drafter --

def test_prompt_lookup_drafts_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    drafter = NgramDrafter(min_n=2, max_n=3)
    prompt = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8]
    assert drafter.propose("a", prompt, [1, 2, 3], 4) == [4, 5, 9, 2]     # 3-gram 1 2 3 beats 2-gram 2 3's later 7
    assert drafter.propose("b", prompt, [9, 2, 3], 2) == [7, 8]            # the latest occurrence of 9 2 3
    assert drafter.propose("c", [1, 2, 3], [4], 4) == []                   # no earlier 2-gram ends in 3 4
    assert drafter.propose("d", [4, 4, 4, 4, 4], [], 0) == []


def test_the_incremental_index_equals_one_built_from_scratch():
    rng = random.Random(0)
    tokens = [rng.randrange(6) for _ in range(300)]
    grown, proposals = NgramIndex(2, 4), []
    for end in range(1, len(tokens)):
        proposals.append(grown.propose(Tokens(tokens[:5], tokens[5:end]) if end > 5 else Tokens(tokens[:end], []), 3))
    for end in range(1, len(tokens)):
        fresh = NgramIndex(2, 4).propose(Tokens(tokens[:end], []), 3)
        assert proposals[end - 1] == fresh, end


# -- the acceptance estimate --

def test_acceptance_moves_from_the_prior_to_what_verification_keeps_and_new_requests_start_from_it():
    tracker = AcceptanceTracker()
    assert tracker.rate("a", 0.5) == pytest.approx(0.5)
    for _ in range(30):
        tracker.observe("a", 4, 0, decay=0.9)     # every draft rejected at once
    assert tracker.rate("a", 0.5) < 0.1
    assert tracker.rate("new", 0.5) < 0.3         # a new request starts from the engine's recent acceptance
    for _ in range(30):
        tracker.observe("b", 4, 4, decay=0.9)
    assert tracker.rate("b", 0.5) > 0.9


def test_survival_is_estimated_per_position_so_long_runs_are_seen_as_such():
    """Drafts of 8 that either fail at once or survive whole (prompt lookup on copied code): one chance per
    token would put the 8th's survival at a^8 of a first one's; per position, a run that started goes on."""
    tracker, coin = AcceptanceTracker(), random.Random(0)
    for _ in range(60):
        tracker.observe("a", 8, 8 if coin.random() < 0.5 else 0, decay=0.95)
    s = tracker.survival("a", 0.5, 8)
    assert list(s) == sorted(s, reverse=True)
    assert 0.2 < s[0] < 0.8 and s[7] > 0.75 * s[0]       # the 8th nearly as likely as the first


def test_a_run_that_held_is_expected_to_go_on_and_a_broken_one_to_break_again():
    tracker = AcceptanceTracker()
    for block in range(12):                              # stretches of copying, stretches of new text
        for _ in range(5):
            tracker.observe("a", 4, 0 if block % 2 else 4, decay=0.95)
    broken = tracker.survival("a", 0.5, 4)
    tracker.observe("a", 4, 4, decay=0.95)
    held = tracker.survival("a", 0.5, 4)
    assert held[0] > 0.7 and broken[0] < 0.3


def test_a_position_never_tested_takes_the_requests_pooled_rate():
    tracker = AcceptanceTracker()
    for _ in range(30):
        tracker.observe("a", 2, 1, decay=0.9)            # position 1 always kept, position 2 never
    s = tracker.survival("a", 0.5, 4)
    assert s[0] > 0.85 and s[1] / s[0] < 0.2
    assert s[3] / s[2] == pytest.approx(tracker.overall[False].pooled(0.5), abs=0.3)


# -- the choice of lengths --

def offer(seq: Request, n: int, acceptance: float) -> DraftOffer:
    """An offer of n drafts, each kept with `acceptance` given the ones before it."""
    return DraftOffer(seq, tuple(acceptance ** j for j in range(1, n + 1)))


def decode_cost() -> CostModel:
    """20 ms a step plus 1 ms a row: rows are cheap beside the step's fixed cost (a CPU decode step)."""
    return CostModel((0.020, 0.001, 0.0, 0.0, 0.0, 0.0, 0.0))


def decode_request(rid: str, last_token: float, tbt: float = 0.1) -> Request:
    r = Request(rid, list(range(20)), SamplingParams(max_tokens=64), 0.0)
    r.output_token_ids = [1]
    r.num_computed_tokens = 20
    r.timings.token_times.append(last_token)
    r.tbt_target_s = tbt
    return r


def test_drafts_are_added_while_they_raise_expected_tokens_per_second():
    seq = decode_request("a", last_token=0.0)
    time = StepTime(decode_cost())
    time.add_decodes([seq], now=0.0)
    likely = priced_lengths([offer(seq, 8, 0.9)], time, target=1.0, work=1, tokens_left=64)
    assert likely == {"a": 8}
    time = StepTime(decode_cost())
    time.add_decodes([seq], now=0.0)
    # a row costs 1 ms of a 21 ms step: a draft kept with chance below ~1/21 does not pay for it
    assert priced_lengths([offer(seq, 8, 0.03)], time, target=1.0, work=1, tokens_left=64) == {}


def test_no_request_drafts_when_the_tbt_slack_cannot_pay_for_a_row():
    seq = decode_request("a", last_token=0.0, tbt=0.1)
    time = StepTime(decode_cost())
    slack = time.add_decodes([seq], now=0.0795)    # 20.5 ms left of its 100 ms target
    assert priced_lengths([offer(seq, 8, 0.99)], time, target=slack, work=1, tokens_left=64) == {}
    time = StepTime(decode_cost())
    slack = time.add_decodes([seq], now=0.0770)    # 23 ms left: two rows fit
    assert priced_lengths([offer(seq, 8, 0.99)], time, target=slack, work=1, tokens_left=64) == {"a": 2}


def test_the_likeliest_drafts_get_the_rows_first_and_the_budget_caps_them():
    a, b = decode_request("a", 0.0), decode_request("b", 0.0)
    time = StepTime(decode_cost())
    time.add_decodes([a, b], now=0.0)
    chosen = priced_lengths([offer(a, 8, 0.95), offer(b, 8, 0.3)], time, target=1.0, work=2,
                            tokens_left=6)
    assert sum(chosen.values()) == 6 and chosen["a"] > chosen.get("b", 0)


def test_adaptive_speculation_drafts_nothing_without_a_step_time_model_and_fixed_drafts_all():
    pool = BlockManager(64, 4)
    sched = Scheduler(pool, "deadline", Knobs(speculative_tokens=4))
    sched.speculator = Speculator()
    r = Request("a", [1, 2, 3, 1, 2], SamplingParams(max_tokens=16), 0.0)
    sched.add(r)
    sched.commit(sched.schedule())
    r.output_token_ids.append(3)          # the prompt computed, its first token out: a decode that can draft
    assert sched.schedule().num_draft_tokens == 0
    sched.set_knobs(Knobs(speculative_tokens=4, speculative_mode="fixed"))
    result = sched.schedule()
    assert result.num_draft_tokens == 3 and r.draft_token_ids == [1, 2, 3]      # what followed "3" before... "1 2 3"


def test_measured_verification_steps_price_drafted_rows_in_place_of_the_fit():
    """The fit prices a row at 20 ms; the measured verification steps at 5 ms (and more at a long
    context): the rows are priced by the measurements, and the cheaper rows buy a longer draft."""
    rows = VerifyRows((1, 2, 3, 5, 9), (64, 1024), ((0.040, 0.045, 0.050, 0.060, 0.080),
                                                     (0.050, 0.057, 0.064, 0.078, 0.106)))
    assert rows.row_s(1, 64) == pytest.approx(0.005)
    assert rows.row_s(12, 64) == pytest.approx(0.005)               # past the last count: its segment's slope
    assert rows.row_s(1, 544) == pytest.approx(0.006)               # linear in context between the two
    fit = (0.020, 0.020, 0.0, 0.0, 0.0, 0.0, 0.0)
    seq = decode_request("a", last_token=0.0)
    lengths = {}
    for model in (CostModel(fit), CostModel(fit, verify_rows=rows)):
        time = StepTime(model)
        time.add_decodes([seq], now=0.0)
        k = priced_lengths([offer(seq, 16, 0.8)], time, 1.0, 1, 64).get("a", 0)
        lengths[model.verify_rows is None] = k
        assert time.seconds() == pytest.approx(model.predict_with_drafts(0, 1 + k, 1 + k, 21 * (1 + k), 0, 1 + k, k),
                                               rel=0.05)
    assert 0 < lengths[True] < lengths[False]
    assert CostModel(fit, verify_rows=rows).scaled(2.0).verify_rows.row_s(1, 64) == pytest.approx(0.010)


def test_the_pricing_looks_past_a_row_that_does_not_pay_alone():
    """The first drafted row costs as much as the decode (a kernel's 2-row path), the next ones 2 ms each:
    one row alone lowers the step's rate, eight raise it 3x, so eight are verified."""
    rows = VerifyRows((1, 2, 3, 5, 9), (64, 1024), ((0.040, 0.080, 0.082, 0.086, 0.094),) * 2)
    seq = decode_request("a", last_token=0.0)
    time = StepTime(CostModel((0.040, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), verify_rows=rows))
    time.add_decodes([seq], now=0.0)
    assert priced_lengths([offer(seq, 1, 0.95)], time, 1.0, 1, 64) == {}
    assert priced_lengths([offer(seq, 8, 0.95)], time, 1.0, 1, 64) == {"a": 8}
    assert time.seconds() == pytest.approx(0.094)


def test_verification_steps_are_measured_and_survive_a_save(tiny_hf, tmp_path):
    engine = make_engine(tiny_hf[0], num_kv_blocks=512, block_size=16)
    rows = measure_verify_rows(engine, repeats=1)
    assert rows.rows == VERIFY_ROWS and len(rows.seconds) == 2
    assert all(list(s) == sorted(s) for s in rows.seconds)
    model = replace(CostModel((0.01,) * 7), verify_rows=rows)
    assert CostModel.load(model.save(tmp_path / "m.json")).verify_rows == rows
    assert_no_kv_leak(engine)


def test_a_draft_the_pricing_keeps_out_is_still_tested_against_the_sampled_token():
    """With no step-time slack nothing is verified, yet each decode's proposal meets the token it
    sampled: the acceptance estimate learns from those, so a prior too low to pay for a row is corrected."""
    speculator = Speculator()
    knobs = Knobs(speculative_tokens=4)
    r = Request("a", [1, 2, 3, 1, 2], SamplingParams(max_tokens=16), 0.0)
    r.output_token_ids = [3]
    before = speculator.acceptance.rate("a", 0.2)
    for _ in range(20):
        speculator.begin_step()
        assert len(speculator.offers([r], knobs)) == 1
        first = speculator.drafted("a", 1)
        assert speculator.untested([ScheduledRequest(r, 1, 5)]) == [("a", first[0])] == [("a", 1)]   # "2 3" was followed by 1
        speculator.observe("a", 1, 1, knobs)
    assert speculator.acceptance.rate("a", 0.2) > max(before, 0.8)
    speculator.begin_step()
    assert speculator.untested([ScheduledRequest(r, 1, 5)]) == []          # no offer this step: nothing to test


def test_the_engine_tests_undrafted_proposals_against_what_it_sampled(tiny_hf):
    """A step of 10 ms whose drafted rows cost half a second: adaptive verifies nothing, yet every
    proposal is tested against the sampled token (the oracle's first drafted token is wrong at every
    third output position)."""
    engine = make_engine(tiny_hf[0])
    reference = generate(engine, PROMPTS[:1], GREEDY)
    engine.scheduler.speculator = Speculator(OracleDrafter({tuple(PROMPTS[0]): reference[0]}))
    engine.scheduler.cost = CostModel((0.010, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                                      verify_rows=VerifyRows((1, 2), (64,), ((0.010, 0.5),)))
    seen, drafted = [], []
    observe = engine.scheduler.speculator.observe
    engine.scheduler.speculator.observe = lambda rid, d, kept, knobs: (seen.append((d, kept)),
                                                                     observe(rid, d, kept, knobs))
    engine.step_listeners.append(lambda record: drafted.append(record.draft_tokens))
    engine.set_knobs(speculative_tokens=4, speculative_mode="adaptive")
    engine.add_request(PROMPTS[0], GREEDY)
    while engine.has_unfinished():
        engine.step()
    last = GREEDY.max_tokens - 1        # the decodes after the first token, but the last: it has no room to draft
    assert not any(drafted) and all(d == 1 for d, _ in seen)
    assert [kept for _, kept in seen] == [int(i % 3 != 0) for i in range(1, last)]
    assert_no_kv_leak(engine)


# -- verification --

def test_layout_rows_lay_a_verifying_decode_out_as_decode_rows_of_the_same_sequence():
    r = Request("a", [1, 2, 3], SamplingParams(), 0.0)
    r.output_token_ids, r.num_computed_tokens, r.draft_token_ids = [4], 3, [5, 6]
    p = Request("p", [1] * 8, SamplingParams(), 0.0)
    rows, sampling = layout_rows([ScheduledRequest(r, 3, 3, 2), ScheduledRequest(p, 4, 0)])
    assert [(s.request.request_id, s.num_tokens, s.context_len) for s in rows] == [("a", 1, 3), ("a", 1, 4),
                                                                                    ("a", 1, 5), ("p", 4, 0)]
    assert sampling == [0, 1, 2]
    assert [r.token_ids(c, c + 1)[0] for c in (3, 4, 5)] == [4, 5, 6]


def test_drafts_are_kept_while_each_equals_the_sample_before_it():
    assert kept_drafts([5, 6, 7], [5, 6, 9, 1]) == 2
    assert kept_drafts([5, 6, 7], [4, 6, 7, 1]) == 0
    assert kept_drafts([5, 6, 7], [5, 6, 7, 1]) == 3


# -- the engine: outputs exactly those without speculation --

class OracleDrafter:
    """Drafts a known continuation with every third drafted token wrong: long kept runs and rejections."""

    name = "oracle"

    def __init__(self, answers: dict[tuple[int, ...], list[int]]) -> None:
        self.answers = answers

    def propose(self, request_id, prompt, output, k):
        answer = self.answers[tuple(prompt)]
        nxt = answer[len(output):len(output) + k]
        return [t if (len(output) + i) % 3 else (t + 1) % 250 + 3 for i, t in enumerate(nxt)]

    def forget(self, request_id):
        pass


def generate(engine, prompts, params, k: int = 0) -> list[list[int]]:
    engine.set_knobs(speculative_tokens=k, speculative_mode="fixed")
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
    assert_no_kv_leak(engine)
    return [done[i] for i in ids]


GREEDY = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
SHAPES = {"chunked prefill": dict(token_budget=8), "preemption": dict(num_kv_blocks=40),
          "prefix caching": dict()}


@pytest.mark.parametrize("drafter", ["ngram", "oracle"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_tokens_are_identical_with_and_without_speculation(tiny_hf, drafter, shape):
    engine = make_engine(tiny_hf[0], **SHAPES[shape])
    reference = generate(engine, PROMPTS, GREEDY)
    if drafter == "oracle":
        engine.scheduler.speculator = Speculator(OracleDrafter({tuple(p): r for p, r in zip(PROMPTS, reference)}))
    counts = Counter()
    engine.step_listeners.append(lambda r: counts.update(drafted=r.draft_tokens, kept=r.kept_draft_tokens))
    for k in (1, 3, 8):
        counts.clear()
        assert generate(engine, PROMPTS, GREEDY, k) == reference, k
        assert counts["drafted"] > 0
        if drafter == "oracle":
            assert 0 < counts["kept"] < counts["drafted"]     # both kept and rejected drafts were exercised
    if shape == "preemption":
        assert engine.scheduler.num_preemptions > 0
    if shape == "prefix caching":
        engine.block_manager.check()


def test_a_seeded_request_samples_the_same_tokens_whatever_the_speculation_length(tiny_hf):
    engine = make_engine(tiny_hf[0])
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=48, ignore_eos=True)
    reference = generate(engine, PROMPTS, params)
    engine.scheduler.speculator = Speculator(OracleDrafter({tuple(p): r for p, r in zip(PROMPTS, reference)}))
    for k in (2, 8):
        assert generate(engine, PROMPTS, params, k) == reference


def test_the_sampled_distribution_is_the_target_models_with_drafts_verified(tiny_hf):
    """Temperature 1, no seed: the first two tokens after a prompt, drawn many times with a drafter that
    always proposes the same two tokens, follow the model's own next-token distributions (chi-square)."""
    engine = make_engine(tiny_hf[0], max_num_seqs=128, num_kv_blocks=512)
    prompt = [7, 8, 9]
    logits = engine.runner.prompt_logits(prompt)[-1].double()
    probs = torch.softmax(logits, dim=-1)
    drafted = int(torch.argsort(probs, descending=True)[1])    # a likely token, not the likeliest
    engine.scheduler.speculator = Speculator(type("Fixed", (), {
        "propose": lambda self, rid, prompt, output, k: [drafted][:k], "forget": lambda self, rid: None})())
    params = SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True)
    firsts = Counter(t[0] for t in generate(engine, [prompt] * 2000, params, k=1))
    likely = [t for t in range(len(probs)) if probs[t] * 2000 >= 5]    # chi-square wants expected counts >= 5
    observed = [firsts[t] for t in likely] + [2000 - sum(firsts[t] for t in likely)]
    expected = [float(probs[t]) * 2000 for t in likely]
    expected.append(2000 - sum(expected))
    assert chisquare(observed, expected).pvalue > 0.001


# -- the KV of rejected drafts --

class RandomDrafter:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def propose(self, request_id, prompt, output, k):
        return [self.rng.choice([3, 4]) for _ in range(self.rng.randint(0, k))]

    def forget(self, request_id):
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS, block_size=st.integers(1, 4), spare=st.integers(0, 6), budget=st.integers(1, 32),
       window=st.sampled_from([None, 3]), k=st.integers(1, 6), seed=st.integers(0, 100))
def test_no_block_leaks_with_speculation_under_random_arrivals_aborts_and_preemptions(actions, block_size, spare,
                                                                                      budget, window, k, seed):
    groups = KvGroups.of([False, True, True], window, block_size) if window else None
    largest = groups.peak_pages(24 + 6, budget) if groups else -(-(24 + 6) // block_size)
    pool = PrefixCachingBlockManager(largest + spare, block_size, groups)
    sched = Scheduler(pool, "deadline", Knobs(token_budget=budget, max_num_seqs=8, speculative_tokens=k,
                                             speculative_mode="fixed"))
    sched.speculator = Speculator(RandomDrafter(seed))
    rng, live = random.Random(seed), []
    for i, action in enumerate(actions):
        if action[0] == "add":
            _, tokens, max_tokens, salt = action
            live.append(Request(f"r{i}", tokens, SamplingParams(max_tokens=max_tokens), 0.0, cache_salt=salt))
            sched.add(live[-1])
        elif action[0] == "abort" and live:
            sched.finish(live.pop(action[1] % len(live)), FinishReason.ABORT)
        else:
            for _ in range(action[1] if action[0] == "step" else 0):
                speculative_step(sched, live, rng)
                check_pool(pool, sched)
    for _ in range(400):
        if not sched.has_work():
            break
        speculative_step(sched, live, rng)
        check_pool(pool, sched)
    assert not sched.has_work() and pool.num_free_blocks == pool.num_blocks


def speculative_step(sched: Scheduler, live: list[Request], rng: random.Random) -> None:
    """A step as the engine takes it: a random number of each verifying decode's drafts kept, and its
    kept drafts plus one token emitted; KV is held for exactly the computed tokens' blocks after it."""
    result = sched.schedule()
    kept = {s.request.request_id: rng.randint(0, s.num_drafts) for s in result.scheduled if s.num_drafts}
    emitted = {s.request.request_id: s.request.draft_token_ids[:kept.get(s.request.request_id, 0)] + [3]
               for s in result.scheduled if s.samples}
    sched.commit(result, kept)
    for s in result.scheduled:
        r = s.request
        assert not r.draft_token_ids
        if s.num_drafts:
            assert len(r.block_table) == -(-r.num_computed_tokens // sched.blocks.block_size)
        if s.samples:
            r.output_token_ids.extend(emitted[r.request_id])
            if r.num_output_tokens >= r.max_tokens:
                sched.finish(r, FinishReason.LENGTH)
                live.remove(r)


def test_a_constrained_request_verifies_drafts_row_by_row_masked_and_keeps_its_greedy_answer():
    """Every drafted row is masked by the grammar after the drafts before it, and the grammar's state is
    rolled back: the answer equals the one without speculation and still validates."""
    import json

    import jsonschema

    from engine import LLM
    from engine.structured.constraint import Constraint

    engine = LLM(kv_cache_memory_mb=64).engine
    engine.config.jump_forward = False          # forced tokens would differ in how the free parts are cut
    schema = {"type": "object", "required": ["city", "country"], "additionalProperties": False,
              "properties": {"city": {"type": "string"}, "country": {"type": "string"}}}
    compiled = engine.grammars.compile(Constraint.json_schema(schema))
    text = 'Copy this JSON exactly: {"city": "Lisbon", "country": "Portugal"}'
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    answers, counts = {}, Counter()
    engine.step_listeners.append(lambda r: counts.update(drafted=r.draft_tokens, rows=r.grammar_rows))
    for k in (0, 6):
        engine.set_knobs(speculative_tokens=k, speculative_mode="fixed")
        engine.enqueue(engine.make_request(prompt, SamplingParams(max_tokens=40, temperature=0), grammar=compiled))
        while engine.has_unfinished():
            for out in engine.step():
                answers[k] = out
    assert counts["drafted"] > 0 and counts["rows"] > counts["drafted"]
    assert answers[6].token_ids == answers[0].token_ids
    jsonschema.validate(json.loads(answers[6].text), schema)
    assert_no_kv_leak(engine)


def test_drafts_a_grammar_refuses_are_cut_and_its_state_is_left_as_it_was():
    from engine.structured.drafted_grammar import allowed_drafts

    class Digits:      # accepts digits only, and counts what it holds
        def __init__(self):
            self.held = []

        def accept(self, token):
            if token > 9:
                return False
            self.held.append(token)
            return True

        def rollback(self, n):
            del self.held[len(self.held) - n:]

    grammar = Digits()
    assert allowed_drafts(grammar, [1, 2, 30, 4]) == [1, 2]
    assert grammar.held == []


def test_logprobs_come_one_per_token_and_equal_those_without_speculation(tiny_hf):
    """Each verification row is scored at its own position: the logprobs of a drafted-and-kept token are
    those the plain decode of that position gives, and a stop inside an emission cuts both lists alike."""
    engine = make_engine(tiny_hf[0])
    plain = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)

    def run(params, k):
        engine.set_knobs(speculative_tokens=k, speculative_mode="fixed")
        rid = engine.add_request(PROMPTS[0], params)
        tokens, logprobs = [], []
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == rid:
                    tokens += out.new_token_ids
                    logprobs += out.logprobs
        return tokens, logprobs

    reference, reference_lp = run(plain, 0)
    engine.scheduler.speculator = Speculator(OracleDrafter({tuple(PROMPTS[0]): reference}))
    tokens, logprobs = run(plain, 6)
    assert tokens == reference and len(logprobs) == len(tokens)
    for a, b in zip(logprobs, reference_lp):
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-3)   # fp32 sums in
        # other orders (the second run finds the prompt in the prefix cache, drafts batch positions)
    stop = reference[10]
    stopped = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2, stop_token_ids=(stop,))
    tokens, logprobs = run(stopped, 6)
    assert tokens == reference[:reference.index(stop) + 1] and len(logprobs) == len(tokens)


# -- the simulator's drafter --

def test_the_simulated_drafter_draws_runs_that_hold_or_break_as_measured():
    model = SpeculationModel(1.0, 0.5, held=(0.95,) * 4, broken=(0.3, 0.9))
    drafter = SimulatedDrafter(model, seed=1)
    after = {True: [], False: []}
    held = False
    for _ in range(4000):
        kept = drafter.kept("a", 8)
        after[held].append(kept)
        held = kept == 8
    assert sum(k == 8 for k in after[True]) / len(after[True]) == pytest.approx(0.95 ** 8, abs=0.05)
    assert sum(k > 0 for k in after[False]) / len(after[False]) == pytest.approx(0.3, abs=0.03)
    assert SpeculationModel(1.0, 0.7).chance(True, 5) == 0.7          # no positions measured: geometric


def test_the_shipped_speculation_model_has_measured_positions_per_workload():
    code, chat = workload_speculation("code-editing"), workload_speculation("chat")
    assert len(code.held) == len(code.broken) > 1
    assert code.match_rate > chat.match_rate and code.chance(True, 1) > code.chance(False, 1)
