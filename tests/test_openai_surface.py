"""Logprobs, echo, sampling controls, n > 1, best_of and batches of prompts through the OpenAI API, driven by the
openai client (sync, async and streaming) on the tiny model: what each field changes, checked against the model."""

from __future__ import annotations

import asyncio

import openai
import pytest
import torch

from serving.api_server import ApiConfig
from tests.conftest import make_engine
from tests.live_server import LiveServer

MODEL = "tiny"
PROMPT = "w5 w6 w7 w8"


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name=MODEL, max_waiting=64, max_body_bytes=64 * 1024, default_max_tokens=16)
    engine = lambda: make_engine(tiny_hf[0], num_kv_blocks=256, token_budget=64, kv_cache_dtype="fp32")  # noqa: E731
    with LiveServer(engine, api) as s:
        yield s


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def model_logprobs(server, ids: list[int]) -> torch.Tensor:
    """log_softmax of one forward pass over `ids` (row i scores token i + 1), the reference."""
    return torch.log_softmax(server.engine.runner.prompt_logits(ids).float(), dim=-1)


def encode(server, text: str) -> list[int]:
    return server.engine.tokenizer.encode(text)


def test_chat_top_logprobs_match_the_models_log_softmax(server, client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w9 w10"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=5)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 3
    prompt_ids = server.engine.tokenizer.apply_chat_template([{"role": "user", "content": "w9 w10"}])
    generated = encode(server, r.choices[0].message.content)
    reference = model_logprobs(server, prompt_ids + generated)[len(prompt_ids) - 1:]
    for i, entry in enumerate(content):
        assert len(entry.top_logprobs) == 5
        best = torch.topk(reference[i], 5)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best.values.tolist(), abs=1e-3)
        assert entry.logprob == pytest.approx(best.values[0].item(), abs=1e-3)    # greedy: the top token
        assert bytes(entry.bytes).decode() == entry.token


def test_completion_logprobs_streamed_equal_the_whole_reply(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kwargs) if c.choices]
    streamed = [lp for c in chunks if c.logprobs for lp in c.logprobs.token_logprobs]
    assert whole.logprobs.token_logprobs == pytest.approx(streamed) and len(streamed) == 5
    assert "".join(whole.logprobs.tokens) == whole.text
    assert whole.logprobs.text_offset[0] == 0 and all(len(t) == 2 for t in whole.logprobs.top_logprobs)


def test_echo_with_logprobs_scores_the_prompt_as_lm_eval_asks(server, client):
    """lm-evaluation-harness's loglikelihood request: echo, logprobs 1, max_tokens 1, temperature 0."""
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, echo=True)
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT)
    ids = encode(server, PROMPT)
    lps = choice.logprobs.token_logprobs
    assert lps[0] is None and len(lps) == len(ids) + 1
    reference = model_logprobs(server, ids)
    expected = [reference[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
    assert lps[1:len(ids)] == pytest.approx(expected, abs=1e-3)


def test_a_logit_bias_of_minus_100_bans_a_token(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0)
    first = client.completions.create(**kwargs, logprobs=0).choices[0].logprobs
    token = encode(server, first.tokens[0])[0]
    banned = client.completions.create(**kwargs, logit_bias={str(token): -100}).choices[0].text
    assert encode(server, banned)[0] != token


def test_a_presence_penalty_lowers_the_repeated_tokens_logits_by_its_value(server):
    """The sampler's order (logit bias and penalties, then logprobs in `processed` mode): the penalised row's
    logits are the model's minus the penalty on every token already generated."""
    from engine.sampler import SampleRow, Sampler
    from engine import SamplingParams

    ids = encode(server, PROMPT)
    logits = server.engine.runner.prompt_logits(ids)[-1:].float()
    output = [int(logits.argmax())]
    row = SampleRow("r", SamplingParams(temperature=0, presence_penalty=1.0, logprobs=20), (), ids, output)
    processed = Sampler(logprobs_mode="processed").sample(logits.clone(), [row]).logprobs[0]
    raw = Sampler(logprobs_mode="raw").sample(logits.clone(), [row]).logprobs[0]
    shifted = logits.clone()
    shifted[0, output[0]] -= 1.0
    expected = torch.log_softmax(shifted, -1)[0]
    assert processed.token_id == int(shifted.argmax())
    assert dict(processed.top)[output[0]] == pytest.approx(expected[output[0]].item(), abs=1e-5)
    assert dict(raw.top)[output[0]] == pytest.approx(torch.log_softmax(logits, -1)[0, output[0]].item(), abs=1e-5)


def test_n_1_with_a_seed_reproduces_and_async_clients_agree(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    a = client.completions.create(**kwargs).choices[0].text

    async def async_text() -> str:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        return (await aclient.completions.create(**kwargs)).choices[0].text

    assert asyncio.run(async_text()) == a == client.completions.create(**kwargs).choices[0].text


def test_frequency_penalty_changes_a_repetitive_greedy_continuation(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    plain = encode(server, client.completions.create(**kwargs).choices[0].text)
    penalised = encode(server, client.completions.create(frequency_penalty=2.0, **kwargs).choices[0].text)
    assert len(set(penalised)) >= len(set(plain)) and penalised != plain


def test_n_3_with_a_seed_reproduces_each_choice_with_its_own_index(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=5, n=3,
                  extra_body={"ignore_eos": True})
    a, b = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1                      # their own seed streams
    assert a.usage.completion_tokens == 18 and a.usage.prompt_tokens == len(encode(server, PROMPT))


def test_n_streamed_assembles_to_the_whole_reply(server, client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "w9 w10"}], max_tokens=5, temperature=0.8,
                  seed=2, n=2)
    whole = client.chat.completions.create(**kwargs)
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finish == {c.index: c.finish_reason for c in whole.choices}


def test_best_of_keeps_the_likeliest_candidates(server, client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=1.0, seed=9, extra_body={"ignore_eos": True})
    r = client.completions.create(n=1, best_of=4, logprobs=0, **kwargs)
    candidates = client.completions.create(n=4, logprobs=0, **kwargs)     # the same four seed streams
    best = max(candidates.choices, key=lambda c: sum(c.logprobs.token_logprobs))
    assert len(r.choices) == 1 and r.choices[0].text == best.text
    assert r.usage.completion_tokens == 16                                 # every candidate is generated


@pytest.mark.parametrize("prompts", [["w5 w6", "w7 w8 w9", "w10"], [[11, 12, 13], [14, 15]]])
def test_a_batch_of_prompts_gets_a_choice_per_prompt(server, client, prompts):
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=3, temperature=0, n=2,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == list(range(2 * len(prompts)))
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].text
        assert r.choices[2 * i].text == r.choices[2 * i + 1].text == alone   # greedy: both choices agree
