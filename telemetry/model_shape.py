"""A decoder model's shape and what follows from it: parameter counts, attention FLOPs per pair and
K/V values per token. The one description both the live MFU/MBU accounting (telemetry.model_cost)
and the GPU hardware profiles (simulation.hardware_profile) compute from; field names are the
engine's ModelConfig's."""

from __future__ import annotations

from dataclasses import dataclass

from engine.model_config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    @staticmethod
    def of(config: ModelConfig) -> ModelShape:
        return ModelShape(config.num_layers, config.hidden_size, config.intermediate_size, config.num_heads,
                          config.num_kv_heads, config.head_dim, config.vocab_size)

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer's linear layers (QKV, output, gate/up, down)."""
        h, d = self.hidden_size, self.head_dim
        return h * d * (self.num_heads + 2 * self.num_kv_heads) + self.num_heads * d * h + 3 * h * self.intermediate_size

    @property
    def linear_params(self) -> int:
        """Every decoder layer's linear weights (the LM head not included)."""
        return self.num_layers * self.layer_params

    @property
    def head_params(self) -> int:
        """The LM head's weights (and as many again in an untied embedding)."""
        return self.vocab_size * self.hidden_size

    def attention_flops_per_pair(self, tp: int = 1) -> float:
        """QK^T and PV for one (query, key) pair, all layers, on one GPU of `tp`."""
        return 4 * (self.num_heads / tp) * self.head_dim * self.num_layers

    def kv_heads_per_gpu(self, tp: int = 1) -> float:
        """KV heads are split across TP ranks, and replicated once there are more ranks than heads."""
        return max(1.0, self.num_kv_heads / tp)

    def kv_values_per_token(self, tp: int = 1) -> float:
        """K and V values of one token, all layers, on one GPU of `tp` (times the element size: bytes)."""
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim
