"""Pure decode steps of an fp32 model on quantized weights: one C call per decoder layer
(engine/kernels/csrc/decode_layer.c) instead of ~15 Python-level calls.

With the weights on 4-bit kernels a SmolLM2 decode step at batch 1 spent about as long in each layer's
module dispatch, argument checks, ctypes calls and small torch ops as in its matmuls; the C layer
runs the same kernels back to back. It applies where every layer's projections are quantized (a fused
q/k/v or gate/up of up to 3 parts, which may differ in type; a bias, as Qwen2's q/k/v), the model runs in
fp32 on the CPU with the library's AVX2 code, the step is decodes only on the CPU attention backend,
and the step's rows stay on the quantized kernels. Anything else takes the model's Python path.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from engine.attention.cpu_attention import CpuAttentionMetadata, CpuPagedAttention
from engine.kernels.cpu_kernels import CpuLibrary, fast_library
from engine.kernels.quantized_linear import QuantizedLinear, QuantizedPath

c_int, c_i64, c_ptr, c_float = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


class QMatrix(ctypes.Structure):
    _fields_ = [("type", c_int), ("interleaved", c_int), ("w", c_ptr), ("rows", c_i64), ("cols", c_i64)]


MAX_PARTS = 3   # decode_layer.c's


class QProj(ctypes.Structure):
    _fields_ = [("part", QMatrix * MAX_PARTS), ("nparts", c_int), ("bias", c_ptr), ("rows", c_i64)]


class LayerParams(ctypes.Structure):
    _fields_ = [("qkv", QProj), ("o", QProj), ("gate_up", QProj), ("down", QProj),
                ("post_norm", c_ptr), ("next_norm", c_ptr), ("eps", c_float), ("hidden", c_i64), ("heads", c_i64),
                ("kv_heads", c_i64), ("head_dim", c_i64), ("inter", c_i64)]


class DecodeStep(ctypes.Structure):
    _fields_ = [("n", c_i64), ("cos", c_ptr), ("ssin", c_ptr), ("slots", c_ptr), ("tables", c_ptr), ("lens", c_ptr),
                ("block_size", c_i64), ("width", c_i64), ("scale", c_float), ("kv_fp16", c_int),
                ("qkv", c_ptr), ("q", c_ptr), ("attn", c_ptr), ("proj", c_ptr), ("gate_up", c_ptr), ("act", c_ptr),
                ("int8", c_int)]


def qproj(linear: torch.nn.Module) -> QProj | None:
    """The C view of a projection the layer kernel can run: up to MAX_PARTS quantized parts, fp32."""
    if not isinstance(linear, QuantizedLinear) or len(linear.parts) > MAX_PARTS or linear.dtype != torch.float32:
        return None
    parts = [QMatrix(w.qtype, int(w.interleaved), w.data.data_ptr(), w.rows, w.cols) for w in linear.parts]
    bias = 0 if linear.bias is None else linear.bias.data_ptr()
    return QProj((QMatrix * MAX_PARTS)(*parts), len(parts), bias, linear.out_features)


@dataclass
class CpuDecodeLayers:
    library: CpuLibrary
    path: QuantizedPath
    params: list[LayerParams]      # per layer; the model's modules own the memory they point to
    qkv_rows: int
    q_size: int
    hidden: int
    inter: int

    @classmethod
    def build(cls, model: torch.nn.Module) -> CpuDecodeLayers | None:
        """The layer kernel for `model` (an engine.model.transformer.LlamaForCausalLM), or None where it does not apply."""
        library = fast_library()
        layers = model.model.layers
        # decode_layer.c has Llama's block alone: not Gemma 3's (four norms, GeGLU, sliding layers)
        if library is None or model.model.norm.weight.dtype != torch.float32 or model.config.family != "llama":
            return None
        params = []
        for i, layer in enumerate(layers):
            attn, mlp = layer.self_attn, layer.mlp
            if attn.q_norm is not None:   # decode_layer.c has no per-head q/k norms (Qwen3)
                return None
            mats = [qproj(m) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
            if any(m is None for m in mats):
                return None
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.model.norm
            heads = attn.heads
            params.append(LayerParams(*mats, layer.post_attention_layernorm.weight.data_ptr(),
                                      next_norm.weight.data_ptr(), layer.post_attention_layernorm.eps,
                                      attn.o_proj.out_features, heads.num_heads, heads.num_kv_heads, heads.head_dim,
                                      mlp.down_proj.in_features))
        library.lib.decode_layer.argtypes = [ctypes.POINTER(LayerParams), ctypes.POINTER(DecodeStep)] + [c_ptr] * 4
        first = params[0]
        return cls(library, layers[0].mlp.down_proj.path, params, first.qkv.rows, first.heads * first.head_dim,
                   first.hidden, first.inter)

    def applies(self, meta: object, tokens: int) -> bool:
        return (isinstance(meta, CpuAttentionMetadata) and meta.num_decodes == tokens
                and 0 < tokens <= self.path.max_rows)

    def run(self, h: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: CpuPagedAttention,
            kv_cache: torch.Tensor, meta: CpuAttentionMetadata) -> torch.Tensor:
        """All layers over h (the embeddings, updated in place) and x (the first layer's normed input);
        returns the final norm of h."""
        n = h.shape[0]
        assert h.is_contiguous() and x.is_contiguous() and kv_cache.is_contiguous()
        widths = (self.qkv_rows, self.q_size, self.q_size, self.hidden, 2 * self.inter, self.inter)
        scratch = torch.empty(n * sum(widths))
        ptrs, offset = [], scratch.data_ptr()
        for width in widths:
            ptrs.append(offset)
            offset += 4 * n * width
        step = DecodeStep(n, cos.data_ptr(), sin.data_ptr(), meta.slot_mapping.data_ptr(), meta.decode_tables.data_ptr(),
                          meta.decode_lens.data_ptr(), meta.block_size, meta.decode_tables.shape[1], backend.scale,
                          int(kv_cache.dtype == torch.float16), *ptrs, int(self.path.int8))
        layer_bytes, kv_bytes = kv_cache.stride(0) * kv_cache.element_size(), kv_cache.stride(1) * kv_cache.element_size()
        base = kv_cache.data_ptr()
        for i, params in enumerate(self.params):
            k_cache = base + i * layer_bytes
            rc = self.library.lib.decode_layer(ctypes.byref(params), ctypes.byref(step), h.data_ptr(), x.data_ptr(),
                                               k_cache, k_cache + kv_bytes)
            if rc != 0:
                raise RuntimeError(f"decode layer {i} failed ({rc})")
        return x
