"""A Llama-family decoder in plain torch over a flattened, variable-length batch.

Covers SmolLM2, Llama 2/3, Mistral (full attention), Qwen2 (qkv bias), Qwen3 (per-head q/k RMSNorm)
and Phi-3 (LongRoPE, in engine/rope.py). Parameter names follow Hugging Face's LlamaForCausalLM except
that q/k/v and gate/up are fused into one matmul each (as Phi-3 stores them), which the loader does when
it reads a checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, HeadShape
from engine.cpu_kernels import CpuLibrary, fast_library
from engine.model_config import ModelConfig
from engine.rope import RotaryEmbedding

if TYPE_CHECKING:
    from engine.cpu_decode import CpuDecodeLayers


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        library = cpu_library_for(x)
        if library is not None:
            return library.add_rms_norm(x.contiguous(), None, self.weight, self.eps)
        # in 16 bits, HF normalizes in fp32 and scales after the cast back
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.weight.shape, eps=self.eps).to(x.dtype)

    def add_norm(self, h: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + delta, RMSNorm(h + delta)): the residual add and the next norm, in one pass on the CPU
        kernels (there h is updated in place), where torch's composite norm costs more than the
        layer's matmuls at a batch-1 decode."""
        library = cpu_library_for(h)
        if library is not None and h.is_contiguous():
            return h, library.add_rms_norm(h, delta.contiguous(), self.weight, self.eps)
        h = h + delta
        return h, self(h)


def cpu_library_for(x: torch.Tensor) -> CpuLibrary | None:
    """The CPU kernels' library where they run x's norms: fp32 on the CPU, with AVX2."""
    return fast_library() if x.dtype == torch.float32 and x.device.type == "cpu" else None


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads = HeadShape(config.num_heads, config.num_kv_heads, config.head_dim)
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x, cos: torch.Tensor, sin: torch.Tensor, backend: AttentionBackend,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """cos/sin: RotaryEmbedding.lookup(positions) of this step's tokens."""
        qkv = self.qkv_proj(x)
        if self.q_norm is not None:
            qkv = self.norm_qk(qkv)
        out = backend.attend_qkv(qkv, self.heads, cos, sin, k_cache, v_cache, meta)
        return self.o_proj(out.reshape(-1, self.q_size))

    def norm_qk(self, qkv: torch.Tensor) -> torch.Tensor:
        """Qwen3's RMSNorm over each q and k head, before RoPE (the backends rotate what they are given)."""
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        dim = self.heads.head_dim
        q = self.q_norm(q.reshape(-1, dim)).view(qkv.shape[0], -1)
        k = self.k_norm(k.reshape(-1, dim)).view(qkv.shape[0], -1)
        return torch.cat([q, k, v], dim=-1)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config, max_positions)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, max_positions)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.decode_layers: CpuDecodeLayers | None = None   # set by the loader where the C layer applies

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logits_indices: torch.Tensor,
                backend: AttentionBackend, kv_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """One step over all scheduled tokens; returns float32 logits only at `logits_indices`.

        kv_cache: [layers, 2, slots, kv_heads, head_dim].
        """
        m, layers = self.model, self.model.layers
        h = m.embed_tokens(input_ids)
        cos, sin = m.rotary.lookup(positions)
        # each residual add runs with the norm after it (the next layer's input norm, fused)
        x = layers[0].input_layernorm(h)
        if self.decode_layers is not None and self.decode_layers.applies(meta, h.shape[0]):
            x = self.decode_layers.run(h, x, cos, sin, backend, kv_cache, meta)
            return self.lm_head(x[logits_indices]).float()
        for i, layer in enumerate(layers):
            h, x = layer.post_attention_layernorm.add_norm(
                h, layer.self_attn(x, cos, sin, backend, kv_cache[i, 0], kv_cache[i, 1], meta))
            if i + 1 < len(layers):
                h, x = layers[i + 1].input_layernorm.add_norm(h, layer.mlp(x))
            else:
                h = h + layer.mlp(x)
        return self.lm_head(m.norm(h[logits_indices])).float()
