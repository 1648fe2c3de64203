"""Greedy output is token-identical to Hugging Face transformers on the same weights (fp32)."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from tests.conftest import assert_no_kv_leak, make_engine, save_hf_model

GREEDY = dict(temperature=0.0, ignore_eos=True)


def prompts(n: int, seed: int = 0, low: int = 3, high: int = 40, vocab: int = 300) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lengths]


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             min_new_tokens=max_new_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run_all(engine, prompt_list, max_tokens, arrive_every: int = 0) -> dict[str, list[int]]:
    """Feed prompts (one every `arrive_every` steps, or all at once) and run to completion."""
    pending = list(enumerate(prompt_list))
    ids, results = {}, {}
    while pending or engine.has_unfinished():
        batch = pending if arrive_every == 0 else pending[:1]
        for i, p in batch:
            ids[engine.add_request(p, SamplingParams(max_tokens=max_tokens, **GREEDY))] = i
        pending = pending[len(batch):]
        for _ in range(max(arrive_every, 1)):
            for out in engine.step():
                if out.finished:
                    results[ids[out.request_id]] = out.token_ids
    return [results[i] for i in range(len(prompt_list))]


def test_single_request_matches_hf(tiny_hf):
    path, hf = tiny_hf
    engine = make_engine(path)
    prompt = prompts(1, seed=1)[0]
    assert run_all(engine, [prompt], 20) == [hf_greedy(hf, prompt, 20)]
    assert_no_kv_leak(engine)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_matches_hf(tiny_hf, chunk):
    """The token budget caps every step, so a 60-token prompt is prefilled in chunks of `chunk`."""
    path, hf = tiny_hf
    engine = make_engine(path, token_budget=chunk)
    prompt = prompts(1, seed=2, low=60, high=61)[0]
    assert run_all(engine, [prompt], 12) == [hf_greedy(hf, prompt, 12)]
    assert_no_kv_leak(engine)


def test_staggered_arrivals_share_mixed_batches(tiny_hf):
    """8 requests arriving every 3 steps: prefill chunks and decodes of others share steps."""
    path, hf = tiny_hf
    engine = make_engine(path, token_budget=16)
    mixed = []
    engine.step_listeners.append(lambda r: mixed.append(r.num_prefill_tokens > 0 and r.num_decode_tokens > 0))
    prompt_list = prompts(8, seed=3)
    got = run_all(engine, prompt_list, 10, arrive_every=3)
    assert got == [hf_greedy(hf, p, 10) for p in prompt_list]
    assert any(mixed), "no step mixed prefill and decode tokens"
    assert_no_kv_leak(engine)


def test_preemption_and_recompute_match_hf(tiny_hf):
    """A pool of 24 blocks of 4 tokens cannot hold 6 requests of ~40 tokens: some are preempted."""
    path, hf = tiny_hf
    engine = make_engine(path, num_kv_blocks=24, block_size=4, token_budget=32)
    prompt_list = prompts(6, seed=4, low=20, high=30)
    got = run_all(engine, prompt_list, 16)
    assert engine.scheduler.num_preemptions > 0
    assert got == [hf_greedy(hf, p, 16) for p in prompt_list]
    assert_no_kv_leak(engine)


@pytest.mark.parametrize("kv_cache_dtype,tolerance", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_logits_match_hf_within_tolerance(tiny_hf, kv_cache_dtype, tolerance):
    """fp32 throughout: HF's logits within 1e-4. With K/V stored in fp16 (the CPU default), each cached
    value moves by up to 2^-11 of itself, and the logits by up to 1e-2 here."""
    path, hf = tiny_hf
    engine = make_engine(path, token_budget=5, kv_cache_dtype=kv_cache_dtype)   # chunks of 5 attend to cached context
    prompt = prompts(1, seed=5, low=23, high=24)[0]
    engine.add_request(prompt, SamplingParams(max_tokens=3, **GREEDY))
    ours = []
    while engine.has_unfinished():
        engine.step(return_logits=True)
        if engine.last_logits is not None and len(engine.last_logits):
            ours.append(engine.last_logits[0])
    full = prompt + hf_greedy(hf, prompt, 3)
    with torch.no_grad():
        ref = hf(torch.tensor([full])).logits[0]
    for i, logits in enumerate(ours):
        torch.testing.assert_close(logits, ref[len(prompt) - 1 + i], atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("model_type,overrides", [
    ("qwen2", {}),                                            # qkv bias
    ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    ("llama", {"num_key_value_heads": 1, "head_dim": 32,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    ("mistral", {"sliding_window": None}),
])
def test_architecture_variants_match_hf(tmp_path, model_type, overrides):
    hf = save_hf_model(tmp_path, model_type, **overrides)
    engine = make_engine(str(tmp_path), token_budget=8)
    prompt_list = prompts(3, seed=6)
    assert run_all(engine, prompt_list, 8) == [hf_greedy(hf, p, 8) for p in prompt_list]
    assert_no_kv_leak(engine)
