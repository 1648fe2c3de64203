"""Sampler and stop conditions: seeds, top-k/top-p, stop ids and strings, min_tokens, abort."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.sampler import Sampler, _top_k, _top_p
from tests.conftest import assert_no_kv_leak, make_engine


def test_top_k_keeps_k_best():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0]])
    out = _top_k(logits, [2, 0])
    assert torch.isinf(out[0]).tolist() == [True, False, False, True]
    assert not torch.isinf(out[1]).any()


def test_a_top_k_past_the_vocabulary_cuts_nothing():
    """Any int the API accepts (the fuzz test sent 2**63, which overflowed a tensor: a 500)."""
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert torch.equal(_top_k(logits, [2**63]), logits) and torch.equal(_top_k(logits, [4]), logits)


def test_top_p_keeps_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(_top_p(logits, torch.tensor([0.8]))).tolist() == [[False, False, True, True]]
    assert torch.isinf(_top_p(logits, torch.tensor([0.1]))).tolist() == [[False, True, True, True]]


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log().repeat(4000, 1)
    params = [SamplingParams(temperature=1.0)] * 4000
    picks = Sampler(seed=0).sample(logits.clone(), [f"r{i}" for i in range(4000)], params, [()] * 4000)
    freq = torch.bincount(torch.tensor(picks), minlength=3).float() / 4000
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    seeded = [SamplingParams(temperature=1.0, seed=7)]
    a = [Sampler().sample(logits[:1].clone(), ["x"], seeded, [()]) for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_banned_tokens_are_never_picked():
    logits = torch.tensor([[0.0, 10.0, 0.0]])
    assert Sampler().sample(logits, ["r"], [SamplingParams(temperature=0)], [(1,)]) != [1]


@pytest.fixture(scope="module")
def engine(tiny_hf):
    return make_engine(tiny_hf[0])


def generate(engine, prompt, **kw):
    engine.add_request(prompt, SamplingParams(**kw))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert_no_kv_leak(engine)
    return outs


def test_stop_token_ids_and_min_tokens(engine):
    free_run = generate(engine, [5, 6, 7], max_tokens=8, temperature=0, ignore_eos=True)[-1].token_ids
    stop_id = free_run[2]
    out = generate(engine, [5, 6, 7], max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[stop_id])
    assert out[-1].finish_reason == "stop" and out[-1].token_ids == free_run[:free_run.index(stop_id) + 1]
    held = generate(engine, [5, 6, 7], max_tokens=8, temperature=0, ignore_eos=True, stop_token_ids=[stop_id],
                    min_tokens=8)
    assert held[-1].finish_reason == "length" and stop_id not in held[-1].token_ids


def test_stop_string_truncates_text_and_streams_nothing_after_it(engine):
    full = generate(engine, [5, 6, 7], max_tokens=10, temperature=0, ignore_eos=True)
    text = full[-1].text
    stop = text.split()[2]
    outs = generate(engine, [5, 6, 7], max_tokens=10, temperature=0, ignore_eos=True, stop=[stop])
    final = outs[-1]
    assert final.finish_reason == "stop"
    assert final.text == text[:text.index(stop)]
    assert "".join(o.text_delta for o in outs) == final.text


def test_streamed_deltas_add_up_to_the_text(engine):
    outs = generate(engine, [9, 10], max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)
    assert "".join(o.text_delta for o in outs) == outs[-1].text
    assert [t for o in outs for t in o.new_token_ids] == outs[-1].token_ids


def test_seeded_requests_repeat_exactly(engine):
    a = generate(engine, [9, 10], max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=11, ignore_eos=True)
    b = generate(engine, [9, 10], max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=11, ignore_eos=True)
    assert a[-1].token_ids == b[-1].token_ids


def test_abort_frees_kv_mid_generation(engine):
    rid = engine.add_request([5] * 30, SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < engine.block_manager.num_blocks
    assert engine.abort(rid)
    assert not engine.abort(rid)
    assert_no_kv_leak(engine)
