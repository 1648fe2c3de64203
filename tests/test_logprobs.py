"""Logprobs of generated and prompt tokens through the engine: the model's own distribution, whatever the
step's shape (prompt chunks, batching), priced as LM-head rows, and without prefix-cache hits for prompts
that must be scored."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from tests.conftest import assert_no_kv_leak, make_engine

PROMPT = list(range(3, 43))          # 40 tokens: three chunks at a 16-token budget


@pytest.fixture(scope="module")
def engine(tiny_hf):
    return make_engine(tiny_hf[0], token_budget=16, kv_cache_dtype="fp32")   # the reference pass keeps fp32 KV


def run(engine, prompt, params):
    engine.add_request(prompt, params)
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert_no_kv_leak(engine)
    return outs


def reference_logprobs(engine, tokens: list[int]) -> torch.Tensor:
    """log_softmax of one whole-sequence forward pass: row i scores token i + 1."""
    return torch.log_softmax(engine.runner.prompt_logits(tokens).float(), dim=-1)


def test_prompt_logprobs_over_chunks_match_one_forward_pass(engine):
    outs = run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=2))
    scored = outs[0].prompt_logprobs
    assert scored is not None and all(o.prompt_logprobs is None for o in outs[1:])
    assert [s.token_id for s in scored] == PROMPT[1:]
    expected = reference_logprobs(engine, PROMPT)
    got = torch.tensor([s.logprob for s in scored])
    torch.testing.assert_close(got, expected[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])],
                               atol=1e-3, rtol=0)
    top = scored[5].top
    assert len(top) == 2 and top[0][0] == int(expected[5].argmax())


def test_generated_logprobs_match_the_model_and_their_top_tokens_lead_with_greedy(engine):
    outs = run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=4, logprobs=3))
    tokens = [o.new_token_ids[0] for o in outs]
    logprobs = [o.logprobs[0] for o in outs]
    expected = reference_logprobs(engine, PROMPT + tokens[:-1])
    for i, (token, lp) in enumerate(zip(tokens, logprobs)):
        row = expected[len(PROMPT) - 1 + i]
        assert lp.token_id == token and lp.logprob == pytest.approx(row[token].item(), abs=1e-3)
        assert lp.top[0][0] == token and len(lp.top) == 3     # greedy: the chosen token is the most likely


def test_a_request_without_logprobs_carries_none(engine):
    outs = run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=2))
    assert all(o.logprobs == () and o.prompt_logprobs is None for o in outs)


def test_scoring_a_prompt_computes_every_position_and_is_priced_as_head_rows(engine):
    """A prompt already in the prefix cache is recomputed when it must be scored, and each scored position
    counts as a row through the LM head in the step records (what the cost model prices)."""
    run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=1))          # caches PROMPT's blocks
    records = []
    engine.step_listeners.append(records.append)
    try:
        outs = run(engine, PROMPT, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
    finally:
        engine.step_listeners.remove(records.append)
    assert outs[0].num_cached_tokens == 0 and len(outs[0].prompt_logprobs) == len(PROMPT) - 1
    assert sum(r.num_prefill_tokens for r in records) == len(PROMPT)
    assert sum(r.head_rows for r in records) == len(PROMPT)      # 39 scored positions + the sampled one


def forks_share_one_prefill(engine, prompt: list[int]) -> None:
    """Four choices of one prompt: the prompt is computed once (the forks compute only the tokens past its
    last full block), the pool holds at most 1.1x one sequence's blocks before decoding diverges, and each
    fork draws from its own seed stream."""
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    records = []
    engine.step_listeners.append(records.append)
    group = engine.fork(engine.make_request(prompt, params, "g"), 4)
    for request in group:
        engine.enqueue(request)
    outs: dict[str, list[int]] = {}
    held_after_prefill = None
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).extend(out.new_token_ids)
        if held_after_prefill is None and all(engine.requests[r.request_id].num_computed_tokens >= len(prompt)
                                              for r in group if r.request_id in engine.requests):
            held_after_prefill = engine.block_manager.num_blocks - engine.block_manager.num_free_blocks
    assert_no_kv_leak(engine)
    assert sorted(outs) == ["g", "g-1", "g-2", "g-3"] and all(len(t) == 6 for t in outs.values())
    assert len({tuple(t) for t in outs.values()}) > 1                  # their own seeds: not one choice four times
    prefilled = sum(r.num_prefill_tokens for r in records)
    block = engine.block_manager.block_size
    assert prefilled <= len(prompt) + 3 * block                         # the prompt once, then each fork's tail
    one_sequence = -(-(len(prompt) + 1) // block)
    assert held_after_prefill is not None and held_after_prefill <= 1.1 * one_sequence


def test_n_forks_prefill_the_prompt_once_and_share_its_blocks(tiny_hf):
    """496 tokens: the tiny model's context is 512."""
    forks_share_one_prefill(make_engine(tiny_hf[0], num_kv_blocks=256, block_size=16, token_budget=512),
                            [3 + (i * 7) % 90 for i in range(496)])


@pytest.mark.slow
def test_n_4_on_a_1000_token_prompt_of_the_bundled_model_prefills_it_once():
    from engine import EngineConfig, LLMEngine

    engine = LLMEngine(EngineConfig(num_kv_blocks=512))
    forks_share_one_prefill(engine, [100 + (i * 37) % 5000 for i in range(1000)])


def test_a_fork_aborted_while_it_waits_leaves_nothing_behind(tiny_hf):
    engine = make_engine(tiny_hf[0], num_kv_blocks=64, block_size=16)
    group = engine.fork(engine.make_request(list(range(3, 60)), SamplingParams(temperature=0, max_tokens=3)), 3)
    for request in group:
        engine.enqueue(request)
    assert engine.abort(group[1].request_id)              # held: it never reached the scheduler
    finished = set()
    while engine.has_unfinished():
        finished |= {o.request_id for o in engine.step() if o.finished}
    assert finished == {group[0].request_id, group[2].request_id}
    assert_no_kv_leak(engine)
