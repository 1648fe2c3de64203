"""FLOPs and bytes moved by one engine step, from the model's shape: the basis of MFU and MBU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.outputs import StepRecord
from telemetry.model_shape import ModelShape

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class ModelCost:
    shape: ModelShape                   # ModelShape.of(the engine's ModelConfig)
    dtype_bytes: int
    # weights kept quantized (engine.model_runner): the bytes its linear layers stream on the kernels,
    # and the steps (by rows) that run there; larger steps also stream the dequantized copy's bytes
    stored_weight_bytes: int | None = None
    kernel_max_rows: int = 0
    kv_dtype_bytes: int | None = None   # the KV cache's element size where it differs from the model's (fp16 on CPU)

    @staticmethod
    def of_engine(engine: LLMEngine) -> ModelCost:
        """A built engine's: its model's shape and dtype, the stored bytes of weights it keeps quantized
        and its KV cache's element size (the daemon's MFU/MBU and benchmarks/step_time.py share it)."""
        runner = engine.runner
        stored = runner.stored_linear_bytes() if runner.quantized_path else None
        return ModelCost(ModelShape.of(engine.model_config), runner.dtype.itemsize, stored,
                         runner.quantized_max_rows, runner.kv_cache.dtype.itemsize)

    @property
    def weight_bytes(self) -> int:
        """The linear layers' weights (the LM head included) at the model dtype's size."""
        return (self.shape.linear_params + self.shape.head_params) * self.dtype_bytes

    def step_weight_bytes(self, tokens: int) -> int:
        """Weight bytes a step of `tokens` rows reads: the stored blocks on the quantized kernels; above
        them the stored blocks (dequantized) and then the dense copy the GEMM reads."""
        if self.stored_weight_bytes is None:
            return self.weight_bytes
        if tokens <= self.kernel_max_rows:
            return self.stored_weight_bytes
        return self.stored_weight_bytes + self.weight_bytes

    def step_flops(self, r: StepRecord) -> float:
        s = self.shape
        tokens = r.num_prefill_tokens + r.num_decode_tokens
        linear = 2 * tokens * s.linear_params + 2 * (r.head_rows or r.num_sampled) * s.head_params
        return float(linear + s.attention_flops_per_pair() * r.attended_pairs)

    def step_bytes(self, r: StepRecord) -> float:
        """Weights read once, cached K/V read for every attended token, new K/V written."""
        kv_token = self.shape.kv_values_per_token() * (self.kv_dtype_bytes or self.dtype_bytes)
        tokens = r.num_prefill_tokens + r.num_decode_tokens
        return float(self.step_weight_bytes(tokens) + kv_token * (r.context_tokens + tokens))
