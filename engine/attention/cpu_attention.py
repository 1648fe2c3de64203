"""Decode attention read in place from the paged KV cache by the C kernel (engine/kernels/csrc/paged_attention.c).

The torch backend gathers every decode's keys and values into a padded buffer for SDPA: each cached
byte is read, written and read again, padded to the longest sequence. In a chat batch on the CPU
those bytes outnumber the weights' (16 sequences of 500 tokens: 368 MB of SmolLM2's fp32 KV against
96 MB of quantized weights), so the kernel reads each sequence's blocks where they lie instead.
Prefill chunks gather their context's keys as the torch backend does (a small part of the work there), and
on AVX-512 their attention runs on the C prefill kernel (engine/kernels/csrc/prefill_attention.c), about
three times torch's SDPA on a 512-token chunk; elsewhere on torch's SDPA.
For an fp32 model, with the cache in fp32 or fp16 (the engine's default here: half the bytes, see
EngineConfig.kv_cache_dtype); a bf16 model takes the torch backend. A sliding-window layer's decodes
longer than the window run on the kernel too, through a table of one-slot blocks listing the window's keys.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.backends import (HeadShape, PrefillChunk, TorchAttention, TorchAttentionMetadata, block_table_matrix,
                              decode_keys, prefill_chunks)
from engine.attention.batch_layout import BatchLayout
from engine.kernels.cpu_kernels import CpuLibrary


KV_DTYPES = (torch.float32, torch.float16)   # what the kernel reads; it computes in fp32


@dataclass
class CpuAttentionMetadata(TorchAttentionMetadata):
    decode_tables: torch.Tensor | None = None   # int32 [decodes, blocks]: each decode's block table, padded
    decode_lens: torch.Tensor | None = None     # int32 [decodes]: keys each decode attends to
    block_size: int = 0


class CpuPagedAttention(TorchAttention):
    """TorchAttention with the decodes on the C kernel."""

    name = "cpu"

    def __init__(self, scale: float, library: CpuLibrary) -> None:
        super().__init__(scale)
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        library.lib.paged_decode_attention.argtypes = [ptr] * 3 + [ctypes.c_int] + [ptr] * 3 + [i64] * 6 + [ctypes.c_float]
        self.library = library

    def prepare(self, layout: BatchLayout, device: torch.device, window: int | None = None) -> CpuAttentionMetadata:
        d = layout.num_decodes
        meta = CpuAttentionMetadata(torch.from_numpy(layout.slot_mapping()).to(torch.long), d, None, None,
                                    prefill_chunks(layout, device, window))
        if d and window is not None and int(layout.seq_lens[:d].max()) > window:
            # the kernel reads a decode's first `lens` keys through its block table: with blocks of one
            # slot the table is the list of the window's slots (decode_keys puts the attended ones first)
            slots, attended = decode_keys(layout, window)
            meta.decode_tables = torch.from_numpy(slots.astype(np.int32))
            meta.decode_lens = torch.from_numpy(attended.sum(axis=1).astype(np.int32))
            meta.block_size = 1
        elif d:
            lens = layout.seq_lens[:d]
            width = -(-int(lens.max()) // layout.block_size)
            meta.decode_tables = torch.from_numpy(block_table_matrix(layout, width, np.int32))
            meta.decode_lens = torch.from_numpy(np.ascontiguousarray(lens, dtype=np.int32))
            meta.block_size = layout.block_size
        return meta

    def attend_qkv(self, qkv, heads: HeadShape, cos, sin, k_cache, v_cache, meta: CpuAttentionMetadata) -> torch.Tensor:
        """A pure decode step of an fp32 model rotates and writes its keys and values in one C pass;
        anything else takes the torch ops."""
        if meta.num_decodes != qkv.shape[0] or qkv.dtype != torch.float32:
            return super().attend_qkv(qkv, heads, cos, sin, k_cache, v_cache, meta)
        q = self.library.rope_store(qkv, heads, cos, sin, meta.slot_mapping, k_cache, v_cache)
        return self._decode(q, k_cache, v_cache, meta)

    def _chunk_attention(self, q, keys, values, chunk: PrefillChunk) -> torch.Tensor:
        if q.dtype == torch.float32 and self.library.avx512:
            out = self.library.prefill_attention(q.contiguous(), keys, values, chunk.context_len, chunk.key_start,
                                                 chunk.window, self.scale)
            if out is not None:
                return out
        return super()._chunk_attention(q, keys, values, chunk)

    def _decode(self, q, k_cache, v_cache, meta: CpuAttentionMetadata) -> torch.Tensor:
        assert q.dtype == torch.float32 and k_cache.dtype in KV_DTYPES and k_cache.dtype == v_cache.dtype
        assert k_cache.is_contiguous() and v_cache.is_contiguous()
        q = q.contiguous()
        out = torch.empty_like(q)
        seqs, heads, head_dim = q.shape
        rc = self.library.lib.paged_decode_attention(
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), int(k_cache.dtype == torch.float16),
            meta.decode_tables.data_ptr(),
            meta.decode_lens.data_ptr(), out.data_ptr(), seqs, heads, k_cache.shape[1], head_dim,
            meta.block_size, meta.decode_tables.shape[1], self.scale)
        if rc != 0:
            raise RuntimeError(f"paged decode attention failed ({rc})")
        return out
