"""The shape of a Llama-family decoder, read from a checkpoint or taken from a named preset."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3 style frequency scaling ("llama3") or plain linear scaling ("linear")."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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
        """From a Hugging Face config.json (Llama, Mistral, Qwen2 and SmolLM2 layouts)."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"unsupported model_type {model_type!r}: expected llama, mistral or qwen2")
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=_rope_scaling(rope),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
            name=cfg.get("_name_or_path") or model_type,
        )


def _rope_scaling(rope: dict[str, Any]) -> RopeScaling:
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in ("default", "llama3", "linear"):
        raise ValueError(f"unsupported rope scaling {rope_type!r}: expected default, llama3 or linear")
    known = {f.name for f in dataclasses.fields(RopeScaling)}
    return RopeScaling(**{k: v for k, v in {**rope, "rope_type": rope_type}.items() if k in known})


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
}
