"""The shape of a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3) or a Gemma 3 one, read from a
checkpoint or taken from a named preset."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

HF_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma3")   # config.json model_type
ROPE_TYPES = ("default", "llama3", "linear", "longrope")
SLIDING, FULL = "sliding_attention", "full_attention"   # transformers' layer_types


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
    qk_norm: bool = False            # Qwen3, Gemma 3: RMSNorm over each q and k head before RoPE
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = "llama"
    # Gemma 3's block: four norms (each weight held as 1 + w, as GGUF stores it), GeGLU (tanh GELU),
    # embeddings times sqrt(hidden); "llama": every other family
    family: str = "llama"
    layer_types: tuple[str, ...] = ()      # per layer SLIDING or FULL; () = every layer full
    sliding_window: int | None = None      # keys a SLIDING layer's query sees, itself included
    rope_local_theta: float | None = None  # SLIDING layers' RoPE base (no scaling); None: rope_theta's table
    query_pre_attn_scalar: float | None = None   # attention scale = this ** -0.5; None: head_dim's
    final_logit_softcapping: float | None = None
    rotary_dim: int | None = None          # head dims RoPE rotates (Phi-4-mini: 3/4 of them); None: all

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer_types for {self.num_layers} layers")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a sliding_window")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim {self.rotary_dim} must be even and within the head size {self.head_dim}")

    @property
    def rotary_dims(self) -> int:
        """Head dims RoPE rotates: rotary_dim, else all of them."""
        return self.rotary_dim or self.head_dim

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    @property
    def layer_sliding(self) -> tuple[bool, ...]:
        """Per layer, whether it attends to a window only."""
        return tuple(self.is_sliding(i) for i in range(self.num_layers))

    @property
    def window(self) -> int | None:
        """The sliding layers' window where the model has any, else None."""
        return self.sliding_window if SLIDING in self.layer_types else None

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
        if model_type in ("gemma3", "gemma3_text"):
            return gemma3_from_hf_config(cfg)
        heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        eos = cfg.get("eos_token_id")
        max_positions = cfg.get("max_position_embeddings", 4096)
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
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
            rotary_dim=int(head_dim * partial) if partial != 1.0 else None,   # transformers' rounding
        )


# Gemma3TextConfig's defaults, for keys a config.json leaves out (a gemma3 text_config often does)
GEMMA3_DEFAULTS: dict[str, Any] = dict(
    vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
    num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072, rms_norm_eps=1e-6, rope_theta=1e6,
    rope_local_base_freq=1e4, query_pre_attn_scalar=256, sliding_window=4096, sliding_window_pattern=6,
    tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, hidden_activation="gelu_pytorch_tanh")


def gemma3_from_hf_config(cfg: dict[str, Any]) -> ModelConfig:
    """Gemma 3 from config.json: "gemma3_text", or "gemma3" (with vision) whose text_config is served."""
    name = cfg.get("_name_or_path") or cfg["model_type"]
    if cfg["model_type"] == "gemma3":
        cfg = {k: v for k, v in cfg.items() if k != "model_type"} | cfg.get("text_config", {})
    c = GEMMA3_DEFAULTS | {k: v for k, v in cfg.items() if v is not None or k.endswith("softcapping")}
    if c["hidden_activation"] != "gelu_pytorch_tanh" or c.get("use_bidirectional_attention"):
        raise ValueError("gemma3 with another activation than gelu_pytorch_tanh or bidirectional attention "
                         "(EmbeddingGemma) is not supported")
    if c.get("attn_logit_softcapping") is not None:
        raise ValueError("attention logit softcapping (attn_logit_softcapping) is not supported")
    layers = c["num_hidden_layers"]
    pattern = c["sliding_window_pattern"]
    types = c.get("layer_types") or [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    full, local = _gemma3_rope(c)
    eos = c["eos_token_id"]
    return ModelConfig(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_layers=layers, num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"], max_position_embeddings=c["max_position_embeddings"], rms_norm_eps=c["rms_norm_eps"],
        rope_theta=float(full.get("rope_theta", c["rope_theta"])),
        rope_scaling=rope_scaling_from(full, c["max_position_embeddings"], None),
        tie_word_embeddings=bool(c["tie_word_embeddings"]), qkv_bias=bool(c.get("attention_bias", False)),
        qk_norm=True, bos_token_id=c["bos_token_id"],
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        name=name, family="gemma3", layer_types=tuple(types), sliding_window=c["sliding_window"],
        rope_local_theta=float(local.get("rope_theta", c["rope_local_base_freq"])),
        query_pre_attn_scalar=float(c["query_pre_attn_scalar"]),
        final_logit_softcapping=c.get("final_logit_softcapping"))


def _gemma3_rope(c: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(global, sliding) RoPE parameters: transformers 5's rope_parameters per layer type, or the older
    rope_scaling (global layers only) beside rope_theta and rope_local_base_freq."""
    params = c.get("rope_parameters") or {}
    if FULL in params or SLIDING in params:
        full, local = dict(params.get(FULL) or {}), dict(params.get(SLIDING) or {})
    else:
        full, local = dict(c.get("rope_scaling") or params), {}
    if (local.get("rope_type") or "default") != "default":
        raise ValueError(f"gemma3 sliding layers with {local['rope_type']!r} RoPE scaling are not supported")
    return full, local


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
    "gemma-3-270m": ModelConfig(262144, 640, 2048, 18, 4, 1, 256, 32768, 1e-6, 1000000.0,
                                tie_word_embeddings=True, qk_norm=True, name="gemma-3-270m", family="gemma3",
                                layer_types=tuple(SLIDING if (i + 1) % 6 else FULL for i in range(18)),
                                sliding_window=512, rope_local_theta=10000.0, query_pre_attn_scalar=256),
}
