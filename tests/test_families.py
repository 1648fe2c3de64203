"""Per family, a tiny random model built with transformers: greedy tokens identical to transformers for
32 tokens on 4 prompts, with chunked prefill, preemption and prefix caching on; from config.json and
(where the family has a GGUF mapping) from a GGUF."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

from engine import ModelLoadError
from engine.model.checkpoint import gguf_architecture, read_hf_directory
from engine.kernels.cpu_kernels import fast_library
from engine.kernels.quantized_linear import QuantizedLinear, load_kernels
from tests.conftest import assert_no_kv_leak, make_engine, save_hf_model
from tests.gguf_writer import write_gguf
from tests.test_hf_equivalence import hf_greedy, run_all

TOKENS = 32
# LongRoPE with a pretraining length of 80 (< 512: an attention factor of 1.16), which prompt and generation
# stay inside: past it transformers recomputes the whole sequence with the long factors, we do not
# (engine/attention/rope.py; test_longrope_tables_are_transformers_short_and_long_ones checks the long factors)
PHI3 = dict(original_max_position_embeddings=80,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                          "long_factor": [1.0 + 2.0 * i for i in range(8)]})
# Gemma 3: six layers (llama.cpp's pattern: five sliding, then a global one), a window of 8 keys that prompts of
# 20-36 tokens and 32 more outgrow, the global layers' RoPE (base 100, linear x2) far from the sliding ones' (10k)
GEMMA3 = dict(head_dim=16, num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=16, tie_word_embeddings=True,
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
FAMILIES = {"qwen3": dict(head_dim=16), "phi3": PHI3, "gemma3": GEMMA3}


def shared_prefix_prompts(n: int = 4, seed: int = 0) -> list[list[int]]:
    """A 16-token prefix (4 blocks of 4) shared by all, then 4..20 tokens of each's own."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 300, (16,), generator=g).tolist()
    return [prefix + torch.randint(3, 300, (4 + 5 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """The family's tiny model with distinct norm weights (transformers initialises them to ones, under
    which a q norm read as a k norm would pass)."""
    path = tmp_path_factory.mktemp(request.param)
    hf = save_hf_model(path, request.param, **FAMILIES[request.param])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if name.endswith("norm.weight"):
                weight.copy_(torch.empty_like(weight).uniform_(0.5, 1.5, generator=g))
    hf.save_pretrained(path, safe_serialization=True)
    return request.param, str(path), hf


def greedy_matches_hf(model_path: str, hf) -> None:
    """token budget 8: chunked prefill; 40 blocks of 4 for 4 requests of up to 68 tokens: preemption (Gemma 3's
    sliding layers give their pages back as the window passes, so there 16 blocks' memory); arrivals every 3
    steps: the later prompts find the first one's prefix cached. K/V in fp32: fp16 moves logits by up to 1e-2
    (test_hf_equivalence), past the gap of a near-tie these models have."""
    blocks = 16 if hf.config.model_type.startswith("gemma3") else 40
    engine = make_engine(model_path, num_kv_blocks=blocks, block_size=4, token_budget=8, kv_cache_dtype="fp32")
    prompts = shared_prefix_prompts()
    assert run_all(engine, prompts, TOKENS, arrive_every=3) == [hf_greedy(hf, p, TOKENS) for p in prompts]
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.stats.hits > 0
    assert_no_kv_leak(engine)


def test_config_json_model_matches_hf(family):
    name, path, hf = family
    greedy_matches_hf(path, hf)


def test_gguf_model_matches_hf(family, tmp_path):
    name, path, hf = family
    gguf_path = str(tmp_path / f"{name}.gguf")
    write_gguf(hf, gguf_path)
    greedy_matches_hf(gguf_path, hf)


Q8_0_LAYERS = {k: 8 for k in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight",
                              "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")}


@pytest.mark.skipif(load_kernels() is None, reason="quantized kernels not built")
def test_quantized_gguf_runs_on_the_kernels_as_the_family_allows(family, tmp_path):
    """Q8_0 projections kept as stored (Phi-3's fused ones too) give the dense path's logits; the C decode
    layer runs Phi-3's, and never Qwen3's or Gemma 3's, whose per-head q/k norms (and Gemma's block) it does
    not have."""
    name, path, hf = family
    gguf_path = str(tmp_path / f"{name}-q8.gguf")
    write_gguf(hf, gguf_path, Q8_0_LAYERS)
    prompt = shared_prefix_prompts()[1]
    quantized = make_engine(gguf_path, weights="quantized", quantized_max_rows=64)
    model = quantized.runner.model
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, QuantizedLinear)
    if fast_library() is not None:
        assert (model.decode_layers is None) == (name in ("qwen3", "gemma3"))
    dense = make_engine(gguf_path, weights="dense").runner.prompt_logits(prompt)
    ours = quantized.runner.prompt_logits(prompt)
    assert float((ours - dense).norm() / dense.norm()) < 0.02   # the kernels quantize activations to 8 bits


def test_unsupported_architectures_are_one_line_errors_naming_the_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4"}))
    with pytest.raises(ModelLoadError, match="^cannot read .*: unsupported model_type 'gemma4': supported are llama, "
                                             "mistral, qwen2, qwen3, phi3, gemma3_text, gemma3$"):
        read_hf_directory(str(tmp_path))
    with pytest.raises(ModelLoadError, match="^unsupported GGUF architecture 'gemma4': supported are llama, qwen2, "
                                             "qwen3, phi3, gemma3$"):
        gguf_architecture({"general.architecture": "gemma4"})


def test_longrope_tables_are_transformers_short_and_long_ones(tmp_path):
    """cos/sin inside the pretraining length from transformers' short frequencies, past it from its long
    ones, both times its attention factor."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.model_config import ModelConfig
    from engine.attention.rope import RotaryEmbedding

    hf = save_hf_model(tmp_path, "phi3", **PHI3)
    ours = RotaryEmbedding(ModelConfig.from_hf_config(json.loads((tmp_path / "config.json").read_text())), 160)
    for positions, seq_len in ((torch.arange(0, 80), None), (torch.arange(80, 160), 81)):
        inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](hf.config, seq_len=seq_len)
        angles = torch.outer(positions.double(), inv_freq.double())
        torch.testing.assert_close(ours.cos[positions, :8], (angles.cos() * factor).float())
        torch.testing.assert_close(ours.sin[positions, 8:], (angles.sin() * factor).float())


def test_the_models_table_names_what_is_supported():
    """docs/models.md's family table: its config.json model types and GGUF architectures are the loaders'."""
    import re
    from pathlib import Path

    from engine.model.checkpoint import GGUF_ARCHITECTURES
    from engine.model_config import HF_FAMILIES

    rows = re.findall(r"^\| [^|]+ \| `(\w+)` \| `(\w+)` \|", (Path(__file__).parent.parent / "docs" / "models.md").read_text(), re.M)
    assert {hf for hf, _ in rows} == set(HF_FAMILIES)
    assert {arch for _, arch in rows} == set(GGUF_ARCHITECTURES)


@pytest.mark.parametrize("cfg,served", [
    ({"model_type": "mistral", "sliding_window": 64}, 64),                       # every layer slides
    ({"model_type": "mistral", "sliding_window": None}, 512),
    ({"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": False}, 512),   # a window it does not use
    ({"model_type": "phi3", "sliding_window": 2047, "max_position_embeddings": 4096}, 2047),   # Phi-3-mini-4k's
])
def test_a_sliding_window_caps_the_served_length(cfg, served):
    """No sliding-window attention yet: up to the window full attention is the same, so that is served."""
    from engine.model_config import ModelConfig

    shape = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 max_position_embeddings=512)
    assert ModelConfig.from_hf_config(shape | cfg).max_position_embeddings == served


def test_a_qwen3_preset_builds_with_its_norms():
    """Random weights of a Qwen3 shape (the qwen3-0.6b preset's layout, tiny): the q/k norms are there."""
    import dataclasses

    from engine.model.checkpoint import dummy_checkpoint
    from engine.model_config import PRESETS
    from engine.model_runner import build_model

    config = dataclasses.replace(PRESETS["tiny"], qk_norm=True)
    model, _ = build_model(dummy_checkpoint(config, torch.float32, 0), torch.float32, torch.device("cpu"), 64)
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (config.head_dim,)
    assert PRESETS["qwen3-0.6b"].qk_norm


def test_gemma3_prompt_past_the_window_in_one_chunk(tmp_path):
    """A first chunk longer than the window (the banded mask over its own keys), on the torch and CPU backends:
    transformers' logits at every position."""
    hf = save_hf_model(tmp_path, "gemma3", **GEMMA3)
    prompt = shared_prefix_prompts()[3]
    assert len(prompt) > 4 * GEMMA3["sliding_window"]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
    for backend in ("torch", "cpu") if fast_library() is not None else ("torch",):
        ours = make_engine(str(tmp_path), attention_backend=backend).runner.prompt_logits(prompt)
        torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


def test_a_gemma3_with_vision_serves_its_text_model(tmp_path):
    """model_type "gemma3" (Gemma3ForConditionalGeneration): text_config and the text model's weights under
    model.language_model. are served, the vision tower's left out: the text model's logits."""
    from safetensors.torch import save_file

    text = tmp_path / "text"
    hf = save_hf_model(text, "gemma3", **GEMMA3)
    state = {"model.language_model." + k.removeprefix("model."): v for k, v in hf.state_dict().items()
             if k != "lm_head.weight"}
    state["model.vision_tower.vision_model.post_layernorm.weight"] = torch.ones(8)
    vision = tmp_path / "vision"
    vision.mkdir()
    save_file(state, str(vision / "model.safetensors"))
    text_config = json.loads((text / "config.json").read_text())
    (vision / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": text_config,
                                                    "vision_config": {"hidden_size": 8}}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (vision / name).write_text((text / name).read_text())
    prompt = shared_prefix_prompts()[0]
    expected = make_engine(str(text)).runner.prompt_logits(prompt)
    torch.testing.assert_close(make_engine(str(vision)).runner.prompt_logits(prompt), expected)


def test_gemma3_config_json_of_older_transformers():
    """rope_theta / rope_local_base_freq / rope_scaling and sliding_window_pattern (transformers 4's keys) and
    query_pre_attn_scalar (the 27B's 168, not its head size) are read; a missing key takes Gemma3TextConfig's."""
    from engine.model_config import ModelConfig

    c = ModelConfig.from_hf_config({"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
                                    "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
                                    "head_dim": 16, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                                    "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 32,
                                    "sliding_window_pattern": 4, "query_pre_attn_scalar": 168})
    assert c.layer_types == ("sliding_attention",) * 3 + ("full_attention",) + ("sliding_attention",) * 3 + (
        "full_attention",)
    assert (c.rope_theta, c.rope_local_theta, c.rope_scaling.rope_type, c.rope_scaling.factor) == (1e6, 1e4, "linear", 8)
    assert (c.window, c.attention_scale, c.vocab_size, c.tie_word_embeddings) == (32, 168 ** -0.5, 262_208, True)


GEMMA_270M = os.path.join(os.environ.get("MODELS_DIR", os.path.expanduser("~/.cache/autotuned-models")),
                          "gemma-3-270m.gguf")
PERPLEXITY_RESULTS = pathlib.Path(__file__).parent.parent / "docs" / "results" / "llama_cpp_perplexity_gemma3.json"


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(GEMMA_270M), reason="../shared/models/get-model.sh gemma-3-270m")
def test_real_gemma_3_270m_on_the_kernels_writes_and_scores_as_llama_cpp():
    """The real base model (Q4_K_M mix: Q5_0/Q4_K/Q6_K/Q8_0): projections and the tied Q8_0 head on the native
    kernels, greedy code that starts a Fibonacci function, and perplexity within 1% of llama-perplexity's on the same
    file and text (recorded by benchmarks/llama_cpp_perplexity.py in docs/results)."""
    import importlib
    import sys

    from engine import LLM, SamplingParams

    llm = LLM(GEMMA_270M, num_kv_blocks=128, block_size=16)
    model = llm.engine.runner.model
    assert isinstance(model.model.layers[0].self_attn.qkv_proj, QuantizedLinear)
    assert isinstance(model.model.layers[0].mlp.down_proj, QuantizedLinear)
    assert isinstance(model.lm_head, QuantizedLinear)
    out = llm.generate("def fibonacci(n):", SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    assert out.text.startswith("\n    if n == 0:")
    llama = next(r for r in json.loads(PERPLEXITY_RESULTS.read_text())["results"]
                 if r["model"] == "gemma-3-270m.gguf" and r["text"] == "default")
    sys.path.insert(0, str(PERPLEXITY_RESULTS.parent.parent.parent / "benchmarks"))   # it imports bench_common
    try:
        bench = importlib.import_module("llama_cpp_perplexity")
    finally:
        sys.path.pop(0)
    ours, chunks = bench.engine_perplexity(llm.engine, llama["ctx"], with_bos=True)
    assert chunks == llama["llama_chunks"]
    assert abs(ours / llama["llama_ppl"] - 1) < 0.01


def test_partial_rotary_embeddings_as_phi_4_mini_match_hf(tmp_path):
    """partial_rotary_factor 0.75 (Phi-4-mini's): RoPE turns 12 of each head's 16 dims, LongRoPE factors
    and all; from config.json and from a GGUF (rope.dimension_count 12)."""
    rope = {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(6)],
            "long_factor": [1.0 + 2.0 * i for i in range(6)], "partial_rotary_factor": 0.75}
    hf = save_hf_model(tmp_path / "hf", "phi3", original_max_position_embeddings=80, rope_scaling=rope,
                       partial_rotary_factor=0.75)
    assert read_hf_directory(str(tmp_path / "hf")).config.rotary_dims == 12
    greedy_matches_hf(str(tmp_path / "hf"), hf)
    gguf_path = tmp_path / "phi4.gguf"
    write_gguf(hf, gguf_path)
    greedy_matches_hf(str(gguf_path), hf)
    if load_kernels() is not None:   # quantized rows are reordered too, and the C decode layer runs them
        q8 = str(tmp_path / "phi4-q8.gguf")
        write_gguf(hf, q8, Q8_0_LAYERS)
        quantized = make_engine(q8, weights="quantized", quantized_max_rows=64)
        assert (quantized.runner.model.decode_layers is None) == (fast_library() is None)
        prompt = shared_prefix_prompts()[1]
        dense = make_engine(q8, weights="dense")
        assert float((quantized.runner.prompt_logits(prompt) - dense.runner.prompt_logits(prompt)).norm()
                     / dense.runner.prompt_logits(prompt).norm()) < 0.02
        assert run_all(quantized, [prompt], 16) == run_all(dense, [prompt], 16)   # decodes on the C layer


def test_rotary_order_pairs_the_rotated_dims_half_a_head_apart():
    from engine.model.checkpoint import rotary_order

    assert rotary_order(8, 4).tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert rotary_order(8, 8).tolist() == list(range(8))
