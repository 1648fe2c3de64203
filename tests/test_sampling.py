"""Sampler and stop conditions: seeds, top-k/top-p, stop ids and strings, min_tokens, abort."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.sampler import SampleRow, Sampler, _min_p, _top_k, _top_p
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
    picks = Sampler(seed=0).sample(logits.clone(), [SampleRow(f"r{i}", p) for i, p in enumerate(params)]).tokens
    freq = torch.bincount(torch.tensor(picks), minlength=3).float() / 4000
    torch.testing.assert_close(freq, probs, atol=0.03, rtol=0)
    seeded = [SamplingParams(temperature=1.0, seed=7)]
    a = [Sampler().sample(logits[:1].clone(), [SampleRow("x", seeded[0])]).tokens for _ in range(3)]
    assert a[0] == a[1] == a[2]


def test_banned_tokens_are_never_picked():
    logits = torch.tensor([[0.0, 10.0, 0.0]])
    assert Sampler().sample(logits, [SampleRow("r", SamplingParams(temperature=0), (1,))]).tokens != [1]


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


def greedy_row(request_id="r", output_ids=(), prompt_ids=(), **params) -> SampleRow:
    return SampleRow(request_id, SamplingParams(temperature=0, **params), (), prompt_ids, output_ids)


def test_min_p_drops_tokens_under_its_share_of_the_top_one():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert (_min_p(probs, torch.tensor([0.5])) == 0).tolist() == [[False, False, True, True]]
    assert (_min_p(probs, torch.tensor([0.0])) == 0).sum() == 0


def test_logit_bias_of_minus_100_bans_a_token_and_plus_100_forces_one():
    logits = torch.tensor([[0.0, 10.0, 5.0]])
    assert Sampler().sample(logits.clone(), [greedy_row(logit_bias={1: -100})]).tokens == [2]
    assert Sampler().sample(logits.clone(), [greedy_row(logit_bias={0: 100})]).tokens == [0]


def test_penalties_follow_openai_and_vllm():
    """Presence: minus its value once per generated token; frequency: minus its value per occurrence;
    repetition (prompt and output): positive logits divided, negative ones multiplied."""
    logits = torch.tensor([[2.0, 2.0, -1.0, 1.0]])
    out = logits.clone()
    from engine.sampler import apply_bias_and_penalties
    rows = [greedy_row(output_ids=[0, 0, 2], presence_penalty=0.5, frequency_penalty=0.25)]
    apply_bias_and_penalties(out, [0], rows)
    torch.testing.assert_close(out, torch.tensor([[2.0 - 0.5 - 0.5, 2.0, -1.0 - 0.5 - 0.25, 1.0]]))
    out = logits.clone()
    apply_bias_and_penalties(out, [0], [greedy_row(prompt_ids=[1], output_ids=[2], repetition_penalty=2.0)])
    torch.testing.assert_close(out, torch.tensor([[2.0, 1.0, -2.0, 1.0]]))


def test_only_the_rows_that_set_them_are_penalised():
    logits = torch.tensor([[3.0, 2.0], [3.0, 2.0]])
    picks = Sampler().sample(logits, [greedy_row("a", output_ids=[0], presence_penalty=2.0), greedy_row("b", [0])])
    assert picks.tokens == [1, 0]


def test_logprobs_are_the_log_softmax_of_the_chosen_row_and_its_top_tokens():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 0.0]])
    expected = torch.log_softmax(logits, dim=-1)
    out = Sampler().sample(logits.clone(), [greedy_row("a", logprobs=2), greedy_row("b")])
    a, b = out.logprobs
    assert b is None and a.token_id == 1
    assert a.logprob == pytest.approx(expected[0, 1].item())
    assert [t for t, _ in a.top] == [1, 2] and a.top[1][1] == pytest.approx(expected[0, 2].item())


def test_logprobs_mode_says_whether_penalties_show_in_them():
    """raw (vLLM's default): the model's distribution; processed: after logit bias and penalties, before
    temperature, so a presence penalty lowers a repeated token's logit by its value."""
    logits = torch.tensor([[2.0, 1.0, 0.5]])
    row = SampleRow("r", SamplingParams(temperature=0.7, seed=1, presence_penalty=1.5, logprobs=3), (), (), [0])
    raw = Sampler(logprobs_mode="raw").sample(logits.clone(), [row]).logprobs[0]
    processed = Sampler(logprobs_mode="processed").sample(logits.clone(), [row]).logprobs[0]
    torch.testing.assert_close(torch.tensor(dict(raw.top)[0]), torch.log_softmax(logits, -1)[0, 0])
    shifted = logits - torch.tensor([[1.5, 0.0, 0.0]])
    torch.testing.assert_close(torch.tensor(dict(processed.top)[0]), torch.log_softmax(shifted, -1)[0, 0])
