"""Triton attention backend: the same contract as TorchAttention, in three kernel launches per layer.

Per layer: write the new K/V into the paged cache, then one decode launch for all decode tokens and
one varlen launch for all prefill chunks, both reading their keys from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.kernels import triton_kernels
from engine.attention.backends import HeadShape, split_rotated
from engine.attention.batch_layout import BatchLayout


@dataclass
class TritonAttentionMetadata:
    """int32 tensors built once per step; rows are sequences in layout order (decodes first)."""
    slot_mapping: torch.Tensor    # [T] cache slot of each new token
    block_tables: torch.Tensor    # [S, max_blocks], padded with block 0
    seq_lens: torch.Tensor        # [S] context + new tokens
    query_starts: torch.Tensor    # [S] first row of each sequence in the flattened batch
    query_lens: torch.Tensor      # [S]
    context_lens: torch.Tensor    # [S]
    num_decodes: int
    num_prefills: int
    max_query_len: int            # longest prefill chunk (sizes the prefill grid)
    block_size: int


class TritonAttention:
    name = "triton"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def prepare(self, layout: BatchLayout, device: torch.device) -> TritonAttentionMetadata:
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device)  # noqa: E731
        d = layout.num_decodes
        return TritonAttentionMetadata(
            slot_mapping=to(layout.slot_mapping()),
            block_tables=to(pad_block_tables(layout.block_tables)),
            seq_lens=to(layout.seq_lens),
            query_starts=to(layout.query_starts),
            query_lens=to(layout.query_lens),
            context_lens=to(layout.context_lens),
            num_decodes=d,
            num_prefills=layout.num_seqs - d,
            max_query_len=int(layout.query_lens[d:].max()) if layout.num_seqs > d else 0,
            block_size=layout.block_size,
        )

    def attend_qkv(self, qkv, heads: HeadShape, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        return self.attend(*split_rotated(qkv, heads, cos, sin), k_cache, v_cache, meta)

    def attend(self, q, k, v, k_cache, v_cache, meta: TritonAttentionMetadata) -> torch.Tensor:
        # Writing first lets both kernels read every key from one place, the paged cache.
        triton_kernels.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        d = meta.num_decodes
        triton_kernels.paged_decode(q[:d], out[:d], k_cache, v_cache, meta.block_tables, meta.seq_lens,
                                    meta.block_size, self.scale)
        triton_kernels.varlen_prefill(q, out, k_cache, v_cache, meta.block_tables, meta.query_starts,
                                      meta.query_lens, meta.context_lens, d, meta.num_prefills,
                                      meta.max_query_len, meta.block_size, self.scale)
        return out


def pad_block_tables(tables: list[np.ndarray]) -> np.ndarray:
    """One [S, max_blocks] table; padding is never read because keys stop at each seq_len."""
    width = max((len(t) for t in tables), default=0)
    padded = np.zeros((len(tables), max(width, 1)), dtype=np.int32)
    for i, t in enumerate(tables):
        padded[i, :len(t)] = t
    return padded
