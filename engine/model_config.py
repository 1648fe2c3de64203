"""The shape of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3), read from a checkpoint or
taken from a named preset."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3")   # config.json model_type
ROPE_TYPES = ("default", "llama3", "linear", "longrope")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling ("llama3"), plain linear scaling ("linear") or Phi-3's LongRoPE
    ("longrope": per-frequency short and long factors and an attention factor on cos/sin)."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False            # Qwen3: RMSNorm over each q and k head before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token across all layers, per byte of element size."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3, Phi-3 and SmolLM2 layouts)."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in HF_FAMILIES:
            raise ValueError(f"unsupported model_type {model_type!r}: supported are {', '.join(HF_FAMILIES)}")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
            raise ValueError("partial rotary embeddings (partial_rotary_factor < 1, as Phi-4-mini's) are not supported")
        eos = cfg.get("eos_token_id")
        max_positions = cfg.get("max_position_embeddings", 4096)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cap_to_window(max_positions, _sliding_window(cfg)),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=rope_scaling_from(rope, max_positions, cfg.get("original_max_position_embeddings")),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            name=cfg.get("_name_or_path") or model_type,
        )


def _sliding_window(cfg: dict[str, Any]) -> int | None:
    """The attention window of config.json's sliding-window layers, None where every layer attends to all."""
    if not cfg.get("use_sliding_window", True):   # Qwen2/3 keep a window they do not use
        return None
    layer_types = cfg.get("layer_types")
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return cfg.get("sliding_window")


def cap_to_window(max_positions: int, window: int | None) -> int:
    """Sliding-window attention is not implemented: serve sequences of up to the window, where it is the
    same as full attention (transformers: a query sees the `window` keys up to itself), rather than
    compute other attention than the model's past it."""
    if window is None or int(window) >= max_positions:
        return max_positions
    window = int(window)
    log.warning("sliding-window attention (window %d) is served as full attention: sequences capped at %d tokens "
                "instead of %d", window, window, max_positions)
    return window


def rope_scaling_from(rope: dict[str, Any], max_positions: int, original_max: int | None) -> RopeScaling:
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    rope_type = "longrope" if rope_type == "su" else rope_type   # Phi-3's first name for it
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope scaling {rope_type!r}: expected {', '.join(ROPE_TYPES)}")
    known = {f.name for f in dataclasses.fields(RopeScaling)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in {**rope, "rope_type": rope_type}.items() if k in known}
    values = {k: v for k, v in values.items() if v is not None}
    if rope_type == "longrope":
        values.update(_longrope_lengths(rope, max_positions, original_max))
    return RopeScaling(**values)


def _longrope_lengths(rope: dict[str, Any], max_positions: int, original_max: int | None) -> dict[str, Any]:
    """LongRoPE's pretraining length (Phi-3 keeps it beside max_position_embeddings, which transformers
    prefers) and its attention factor, as transformers derives it where the config gives none."""
    original = int(original_max or rope.get("original_max_position_embeddings") or max_positions)
    factor = rope.get("factor") or max_positions / original
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"original_max_position_embeddings": original, "attention_factor": float(attention)}


_LLAMA3_ROPE = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)

# Shapes of public checkpoints, for random-weight ("dummy") performance studies without a download.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(512, 64, 128, 2, 4, 2, 16, 512, name="tiny"),
    "smollm2-135m": ModelConfig(49152, 576, 1536, 30, 9, 3, 64, 8192, 1e-5, 100000.0,
                                tie_word_embeddings=True, name="smollm2-135m"),
    "llama-3.2-1b": ModelConfig(128256, 2048, 8192, 16, 32, 8, 64, 131072, 1e-5, 500000.0, _LLAMA3_ROPE,
                                tie_word_embeddings=True, name="llama-3.2-1b"),
    "llama-3.1-8b": ModelConfig(128256, 4096, 14336, 32, 32, 8, 128, 131072, 1e-5, 500000.0, _LLAMA3_ROPE,
                                name="llama-3.1-8b"),
    "mistral-7b": ModelConfig(32000, 4096, 14336, 32, 32, 8, 128, 32768, 1e-5, 1000000.0, name="mistral-7b"),
    "qwen2-0.5b": ModelConfig(151936, 896, 4864, 24, 14, 2, 64, 32768, 1e-6, 1000000.0,
                              tie_word_embeddings=True, qkv_bias=True, name="qwen2-0.5b"),
    "qwen3-0.6b": ModelConfig(151936, 1024, 3072, 28, 16, 8, 128, 40960, 1e-6, 1000000.0,
                              tie_word_embeddings=True, qk_norm=True, name="qwen3-0.6b"),
}
