"""Bad input raises a clear error and leaves the engine usable."""

from __future__ import annotations

import pytest

from engine import EngineConfig, InvalidRequestError, LLMEngine, ModelLoadError, SamplingParams
from tests.conftest import assert_no_kv_leak, make_engine


@pytest.fixture(scope="module")
def engine(tiny_hf):
    return make_engine(tiny_hf[0], num_kv_blocks=40, block_size=4)


@pytest.mark.parametrize("prompt,params,match", [
    ("", SamplingParams(), "prompt is empty"),
    ([], SamplingParams(), "prompt is empty"),
    ([5] * 600, SamplingParams(), "maximum length is 512 tokens; the prompt has 600"),
    ([5] * 100, SamplingParams(max_tokens=500), "maximum length is 512"),
    ([5] * 100, SamplingParams(max_tokens=100), "needs 50 KV blocks but the whole pool has 40"),
    ([5, 300], SamplingParams(), "token id 300 is outside the vocabulary"),
    ([5, "x"], SamplingParams(), "prompt must be a string or a list of token ids"),
    (None, SamplingParams(), "prompt must be a string or a list of token ids"),
])
def test_bad_requests_are_rejected_and_engine_still_serves(engine, prompt, params, match):
    with pytest.raises(InvalidRequestError, match=match):
        engine.add_request(prompt, params)
    assert not engine.has_unfinished()
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=3, temperature=0))
    while engine.has_unfinished():
        outs = engine.step()
    assert outs[0].finished and len(outs[0].token_ids) == 3
    assert_no_kv_leak(engine)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"max_tokens": -5}, "max_tokens must be at least 1"),
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_p": 0.0}, "top_p must be in"),
    ({"top_k": -2}, "top_k must be"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens must be between"),
    ({"stop": [""]}, "stop strings must be non-empty"),
    ({"seed": -2**63 - 1}, "seed must be an integer in"),      # found by the API fuzz test: was a 500
    ({"seed": 2**64}, "seed must be an integer in"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(InvalidRequestError, match=match) as info:
        SamplingParams(**kwargs)
    assert info.value.param in kwargs


def test_duplicate_request_id(engine):
    engine.add_request([5, 6], SamplingParams(max_tokens=2), request_id="same")
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request([5, 6], SamplingParams(max_tokens=2), request_id="same")
    assert engine.abort("same")
    assert_no_kv_leak(engine)


@pytest.mark.parametrize("model", ["/no/such/model", "no-such-preset", "/tmp"])
def test_unknown_model_path_or_preset(model):
    with pytest.raises(ModelLoadError, match="unknown model"):
        LLMEngine(EngineConfig(model=model))


def test_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        EngineConfig(model="tiny", dtype="int3").torch_dtype()
