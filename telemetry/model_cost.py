"""FLOPs and bytes moved by one engine step, from the model's shape: the basis of MFU and MBU."""

from __future__ import annotations

from dataclasses import dataclass

from engine.model_config import ModelConfig
from engine.outputs import StepRecord


@dataclass(frozen=True)
class ModelCost:
    config: ModelConfig
    dtype_bytes: int
    # weights kept quantized (engine.model_runner): the bytes its linear layers stream on the kernels,
    # and the steps (by rows) that run there; larger steps also stream the dequantized copy's bytes
    stored_weight_bytes: int | None = None
    kernel_max_rows: int = 0
    kv_dtype_bytes: int | None = None   # the KV cache's element size where it differs from the model's (fp16 on CPU)

    @property
    def layer_matmul_params(self) -> int:
        c = self.config
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        return c.num_layers * (c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size)

    @property
    def weight_bytes(self) -> int:
        """The linear layers' weights (the LM head included) at the model dtype's size."""
        c = self.config
        lm_head = c.vocab_size * c.hidden_size
        return (self.layer_matmul_params + lm_head) * self.dtype_bytes

    def step_weight_bytes(self, tokens: int) -> int:
        """Weight bytes a step of `tokens` rows reads: the stored blocks on the quantized kernels; above
        them the stored blocks (dequantized) and then the dense copy the GEMM reads."""
        if self.stored_weight_bytes is None:
            return self.weight_bytes
        if tokens <= self.kernel_max_rows:
            return self.stored_weight_bytes
        return self.stored_weight_bytes + self.weight_bytes

    def step_flops(self, r: StepRecord) -> float:
        c = self.config
        tokens = r.num_prefill_tokens + r.num_decode_tokens
        linear = 2 * tokens * self.layer_matmul_params + 2 * r.num_sampled * c.hidden_size * c.vocab_size
        attention = 4 * c.num_layers * c.num_heads * c.head_dim * r.attended_pairs   # QK^T and PV
        return float(linear + attention)

    def step_bytes(self, r: StepRecord) -> float:
        """Weights read once, cached K/V read for every attended token, new K/V written."""
        kv_token = self.config.kv_bytes_per_token * (self.kv_dtype_bytes or self.dtype_bytes)
        tokens = r.num_prefill_tokens + r.num_decode_tokens
        return float(self.step_weight_bytes(tokens) + kv_token * (r.context_tokens + tokens))
