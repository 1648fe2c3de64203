"""A Llama-family decoder in plain torch over a flattened, variable-length batch.

Covers SmolLM2, Llama 2/3, Mistral (full attention), Qwen2 (qkv bias), Qwen3 (per-head q/k RMSNorm),
Phi-3 (LongRoPE, in engine/attention/rope.py) and Gemma 3 (GemmaBlock: four norms per layer, GeGLU, scaled
embeddings, sliding-window layers with their own RoPE base, beside global ones). Parameter names follow Hugging Face's LlamaForCausalLM except
that q/k/v and gate/up are fused into one matmul each (as Phi-3 stores them), which the loader does when
it reads a checkpoint.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.backends import AttentionBackend, HeadShape
from engine.kernels.cpu_kernels import CpuLibrary, fast_library
from engine.model_config import ModelConfig, RopeScaling
from engine.attention.rope import RotaryEmbedding

if TYPE_CHECKING:
    from engine.model.cpu_decode import CpuDecodeLayers


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        library = cpu_library_for(x)
        if library is not None:
            return library.add_rms_norm(x.contiguous(), None, self.weight, self.eps)
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        if self.weight.dtype == torch.float32:   # Gemma's (1 + w), kept in fp32: scaled in fp32, then cast
            return F.rms_norm(x.float(), self.weight.shape, self.weight, self.eps).to(x.dtype)
        # in 16 bits, HF's Llama normalizes in fp32 and scales after the cast back
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
    def __init__(self, config: ModelConfig, sliding: bool = False) -> None:
        super().__init__()
        self.sliding = sliding   # attends to the config's sliding_window keys up to itself, with the local RoPE
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
        """Qwen3's and Gemma 3's RMSNorm over each q and k head, before RoPE (the backends rotate what they are given)."""
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
        self.geglu = config.family == "gemma3"   # GELU (tanh approximation) on the gate, else SiLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        gate = F.gelu(gate, approximate="tanh") if self.geglu else F.silu(gate)
        return self.down_proj(gate * up)


class DecoderLayer(nn.Module):
    """Llama's block; Gemma 3's adds pre_feedforward_layernorm and post_feedforward_layernorm, and its
    post_attention_layernorm normalizes the attention's output (not the residual) before the add."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, config.is_sliding(layer))
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        if config.family == "gemma3":
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, rotary_local: RotaryEmbedding | None) -> None:
        super().__init__()
        self.config = config
        # no random init: the weights come from the checkpoint, and normal_ on the meta device (build_model)
        # imports torch._dynamo, ~140 MB resident for the process's life
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary, self.rotary_local = rotary, rotary_local


def local_rotary(config: ModelConfig, max_positions: int) -> RotaryEmbedding | None:
    """The sliding layers' RoPE table where their base differs from the global layers' (Gemma 3: 10k, no
    scaling, against 1M and the config's scaling), else None (they share the global table)."""
    if config.window is None or config.rope_local_theta is None:
        return None
    return RotaryEmbedding(dataclasses.replace(config, rope_theta=config.rope_local_theta,
                                               rope_scaling=RopeScaling()), max_positions)


class LlamaForCausalLM(nn.Module):
    """rotary, rotary_local: the RoPE tables (local_rotary), made on the model's device by the caller, who
    builds the rest on the meta device, where computing them would import torch._dynamo (as normal_ would)."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, rotary_local: RotaryEmbedding | None) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, rotary, rotary_local)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.decode_layers: CpuDecodeLayers | None = None   # set by the loader where the C layer applies
        # with KV pages per layer group (engine/kv_cache/kv_groups.py): each layer's (group, lane); set by the runner
        self.kv_layer_slots: tuple[tuple[int, int], ...] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logits_indices: torch.Tensor,
                backend: AttentionBackend, kv_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """One step over all scheduled tokens; returns float32 logits only at `logits_indices`.

        kv_cache: [layers, 2, slots, kv_heads, head_dim], or [lanes, ...] with layer groups (layer_kv).
        """
        if self.config.family == "gemma3":
            return self._gemma_forward(input_ids, positions, logits_indices, backend, kv_cache, meta)
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
                h, layer.self_attn(x, cos, sin, backend, *self.layer_kv(i, kv_cache, meta, False)))
            if i + 1 < len(layers):
                h, x = layers[i + 1].input_layernorm.add_norm(h, layer.mlp(x))
            else:
                h = h + layer.mlp(x)
        return self.lm_head(m.norm(h[logits_indices])).float()

    def layer_kv(self, i: int, kv_cache: torch.Tensor, meta: Any,
                 sliding: bool) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Layer i's K and V caches and attention metadata: its lane of the pages and its group's metadata with
        layer groups, else its own slice and the step's (windowed for a sliding layer) metadata."""
        if self.kv_layer_slots is not None:
            group, lane = self.kv_layer_slots[i]
            return kv_cache[lane, 0], kv_cache[lane, 1], meta.groups[group]
        return kv_cache[i, 0], kv_cache[i, 1], meta.sliding if sliding else meta

    def _gemma_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logits_indices: torch.Tensor,
                       backend: AttentionBackend, kv_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """Gemma 3: embeddings times sqrt(hidden) in the model's dtype (as transformers rounds it); each
        half-block's output normed before its residual add; sliding layers on the local RoPE table and
        the step's windowed attention metadata (meta.sliding)."""
        m, layers, c = self.model, self.model.layers, self.config
        h = m.embed_tokens(input_ids)
        h = h * torch.tensor(c.hidden_size ** 0.5, dtype=h.dtype)
        rope = m.rotary.lookup(positions)
        local = m.rotary_local.lookup(positions) if m.rotary_local is not None else rope
        x = layers[0].input_layernorm(h)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            sliding = attn.sliding
            out = attn(x, *(local if sliding else rope), backend, *self.layer_kv(i, kv_cache, meta, sliding))
            h, x = layer.pre_feedforward_layernorm.add_norm(h, layer.post_attention_layernorm(out))
            out = layer.post_feedforward_layernorm(layer.mlp(x))
            if i + 1 < len(layers):
                h, x = layers[i + 1].input_layernorm.add_norm(h, out)
            else:
                h = h + out
        logits = self.lm_head(m.norm(h[logits_indices])).float()
        cap = c.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
