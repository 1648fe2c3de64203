"""The bundled SmolLM2-135M-Instruct: a real answer, and greedy tokens identical to transformers."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model.checkpoint import bundled_model_path
from tests.conftest import assert_no_kv_leak

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return LLM(dtype="fp32", kv_cache_memory_mb=64, weights="dense")   # transformers dequantizes the GGUF too


def test_answers_capital_of_france(smollm2):
    out = smollm2.chat([{"role": "user", "content": "What is the capital of France?"}],
                       SamplingParams(max_tokens=32, temperature=0))
    assert "Paris" in out[0].text
    assert out[0].finish_reason == "stop"
    assert_no_kv_leak(smollm2.engine)


def test_greedy_tokens_match_transformers_on_the_same_gguf(smollm2):
    from transformers import AutoModelForCausalLM

    path = bundled_model_path()
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32).eval()
    prompts = ["The history of the Roman Empire", "def fibonacci(n):", "Water boils at"]
    smollm2.engine.set_knobs(token_budget=16)   # chunked prefill, mixed with the others' decodes
    ours = smollm2.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True), use_tqdm=False)
    for prompt, got in zip(prompts, ours):
        ids = smollm2.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                              pad_token_id=0)[0, len(ids):].tolist()
        assert got.token_ids == ref, prompt
    assert_no_kv_leak(smollm2.engine)
