"""Attention backends over a paged KV cache.

A backend turns a step's BatchLayout into its own metadata once, then for every layer writes the
new K/V into the cache and computes attention for decode tokens and prefill chunks in one call.
The torch backend is the reference and runs anywhere; a Triton backend plugs in beside it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from engine.batch_layout import BatchLayout


class AttentionBackend(Protocol):
    name: str

    def prepare(self, layout: BatchLayout, device: torch.device) -> Any:
        """Per-step metadata shared by all layers."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D], caches: [slots, KVH, D]; returns [T, H, D]."""


@dataclass
class PrefillChunk:
    query_start: int
    query_len: int
    context_len: int
    context_slots: torch.Tensor | None   # cached positions [0, context_len), None for a first chunk
    mask: torch.Tensor | None            # [query_len, context_len + query_len] causal with offset


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor           # [T]
    num_decodes: int
    decode_slots: torch.Tensor | None    # [D, Lmax] gather indices (padded with slot 0)
    decode_mask: torch.Tensor | None     # [D, 1, 1, Lmax] True where a key is attended
    prefills: list[PrefillChunk]


class TorchAttention:
    """Gather-then-SDPA: decodes batched into one padded call, each prefill chunk in its own call."""

    name = "torch"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def prepare(self, layout: BatchLayout, device: torch.device) -> TorchAttentionMetadata:
        to = lambda a, dtype=torch.long: torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)  # noqa: E731
        d = layout.num_decodes
        decode_slots = decode_mask = None
        if d:
            lens = layout.seq_lens[:d]
            width = int(lens.max())
            slots = np.zeros((d, width), dtype=np.int64)
            for i, n in enumerate(lens):
                slots[i, :n] = layout.slots(i, 0, int(n))
            decode_slots = to(slots)
            decode_mask = to(np.arange(width)[None, :] < lens[:, None], torch.bool)[:, None, None, :]
        starts = layout.query_starts
        prefills = []
        for i in range(d, layout.num_seqs):
            ctx, n = int(layout.context_lens[i]), int(layout.query_lens[i])
            context = to(layout.slots(i, 0, ctx)) if ctx else None
            mask = torch.ones(n, ctx + n, dtype=torch.bool, device=device).tril(diagonal=ctx) if ctx else None
            prefills.append(PrefillChunk(int(starts[i]), n, ctx, context, mask))
        return TorchAttentionMetadata(to(layout.slot_mapping()), d, decode_slots, decode_mask, prefills)

    def attend(self, q, k, v, k_cache, v_cache, meta: TorchAttentionMetadata) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        d = meta.num_decodes
        if d:
            out[:d] = self._decode(q[:d], k_cache, v_cache, meta)
        for chunk in meta.prefills:
            s, e = chunk.query_start, chunk.query_start + chunk.query_len
            out[s:e] = self._prefill(q[s:e], k[s:e], v[s:e], k_cache, v_cache, chunk)
        return out

    def _decode(self, q, k_cache, v_cache, meta: TorchAttentionMetadata) -> torch.Tensor:
        keys = k_cache[meta.decode_slots].transpose(1, 2)      # [D, KVH, L, Dh]
        values = v_cache[meta.decode_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=meta.decode_mask,
                                             scale=self.scale, enable_gqa=True)
        return out.squeeze(2)

    def _prefill(self, q, k, v, k_cache, v_cache, chunk: PrefillChunk) -> torch.Tensor:
        if chunk.context_slots is not None:
            k = torch.cat([k_cache[chunk.context_slots], k])
            v = torch.cat([v_cache[chunk.context_slots], v])
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=chunk.mask,
            is_causal=chunk.mask is None, scale=self.scale, enable_gqa=True)
        return out.transpose(0, 1)


BACKENDS = ("torch", "triton", "auto")


def make_attention_backend(name: str, scale: float, device: str = "cpu") -> AttentionBackend:
    """Registry of attention backends by name; "auto" is triton on CUDA when it imports, else torch."""
    if name == "auto":
        name = "triton" if str(device).startswith("cuda") and _triton_available() else "torch"
    if name == "torch":
        return TorchAttention(scale)
    if name == "triton":
        if not _triton_available():
            raise ImportError("attention backend 'triton' needs the triton package: pip install 'triton>=3.1'")
        if not str(device).startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"attention backend 'triton' runs on CUDA, not {device!r} "
                             "(on CPU only under TRITON_INTERPRET=1, for tests); use 'torch' or 'auto'")
        from engine.triton_attention import TritonAttention  # lazy: triton is optional and slow to import
        return TritonAttention(scale)
    raise ValueError(f"unknown attention backend {name!r}: expected one of {', '.join(BACKENDS)}")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
