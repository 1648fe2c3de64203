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

from engine.attention.batch_layout import BatchLayout
from engine.kernels.cpu_kernels import fast_library, load_library
from engine.attention.rope import rotate


@dataclass(frozen=True)
class HeadShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int


class AttentionBackend(Protocol):
    name: str

    def prepare(self, layout: BatchLayout, device: torch.device) -> Any:
        """Per-step metadata shared by all layers."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """q: [T, H, D], k/v: [T, KVH, D], caches: [slots, KVH, D]; returns [T, H, D]."""

    def attend_qkv(self, qkv: torch.Tensor, heads: HeadShape, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any) -> torch.Tensor:
        """attend() on a fused projection's output qkv [T, (H + 2 KVH) * D], q and k not yet rotated
        (cos/sin: RotaryEmbedding.lookup of the step's positions)."""


def split_rotated(qkv: torch.Tensor, heads: HeadShape, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q and k rotated, and v, out of a fused projection's output [T, (H + 2 KVH) * D]."""
    tokens, qk_heads, dim = qkv.shape[0], heads.num_heads + heads.num_kv_heads, heads.head_dim
    # q and k heads side by side in qkv: one rotation for both
    qk = rotate(qkv[:, :qk_heads * dim].view(tokens, qk_heads, dim), cos, sin)
    q, k = qk.split([heads.num_heads, heads.num_kv_heads], dim=1)
    return q, k, qkv[:, qk_heads * dim:].view(tokens, heads.num_kv_heads, dim)


@dataclass
class PrefillChunk:
    query_start: int
    query_len: int
    context_len: int
    slots: torch.Tensor | None           # cache slots of the keys attended [key_start, context_len + query_len); None
                                         # for a first chunk, whose own keys are all there is
    mask: torch.Tensor | None            # [query_len, keys] True where attended; None: plain causal (a first chunk)
    key_start: int = 0                   # position of the first key attended
    window: int | None = None            # a sliding-window layer's: each query sees its last `window` keys
    rows: torch.Tensor | None = None     # derived on the first layer, see TorchAttention._rows
    bias: torch.Tensor | None = None


@dataclass
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor           # [T]
    num_decodes: int
    decode_slots: torch.Tensor | None    # [D, W] cache slot of each key position (padded with slot 0)
    decode_mask: torch.Tensor | None     # [D, 1, 1, W] True where a key is attended
    prefills: list[PrefillChunk]
    # Derived on the first layer's attend, which knows the cache's head count and dtype; every
    # later layer reuses them (and the gather buffers) instead of rebuilding them.
    decode_rows: torch.Tensor | None = None     # [D * KVH * W] rows of the cache viewed as [slots * KVH, Dh]
    decode_bias: torch.Tensor | None = None     # decode_mask as 0 / -inf in the query dtype
    decode_buffers: torch.Tensor | None = None  # [2, D * KVH * W, Dh]: this step's gathered keys and values
    # the sliding-window layers' metadata (prepare_step): this object itself where no query's window
    # leaves out a key; None where the model has no sliding layers
    sliding: TorchAttentionMetadata | None = None
    # with KV pages per layer group (engine/kv_cache/kv_groups.py, prepare_grouped_step): each group's
    # metadata, this object first
    groups: list[TorchAttentionMetadata] | None = None


class TorchAttention:
    """Gather-then-SDPA: decodes batched into one padded call, each prefill chunk in its own call.

    Decodes: keys and values are gathered with one index_select per cache into a per-step
    [seqs, KVH, keys, Dh] buffer (rows of Dh contiguous floats, each head's keys contiguous), which
    SDPA reads without a further copy; the query heads sharing a KV head ride as its query length,
    so no GQA expansion is needed. Prefill chunks: one gather covers context and chunk, and SDPA
    gets 4-D inputs without enable_gqa so that it runs its flash kernel on CPU. Gather indices
    and additive masks are built once per step (on the first layer) and reused by every layer.
    """

    name = "torch"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def prepare(self, layout: BatchLayout, device: torch.device, window: int | None = None) -> TorchAttentionMetadata:
        """window: each query attends to the `window` keys up to itself (a sliding-window layer's view)."""
        decode_slots = decode_mask = None
        if layout.num_decodes:
            decode_slots, decode_mask = decode_keys(layout, window)
            decode_slots, decode_mask = _to(decode_slots, device), _to(decode_mask, device, torch.bool)[:, None, None, :]
        return TorchAttentionMetadata(_to(layout.slot_mapping(), device), layout.num_decodes, decode_slots, decode_mask,
                                      prefill_chunks(layout, device, window))

    def attend_qkv(self, qkv, heads: HeadShape, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        return self.attend(*split_rotated(qkv, heads, cos, sin), k_cache, v_cache, meta)

    def attend(self, q, k, v, k_cache, v_cache, meta: TorchAttentionMetadata) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))
        v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
        d = meta.num_decodes
        if d == q.shape[0]:   # a pure decode step: no output buffer to assemble
            return self._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        if d:
            out[:d] = self._decode(q[:d], k_cache, v_cache, meta)
        for chunk in meta.prefills:
            s, e = chunk.query_start, chunk.query_start + chunk.query_len
            out[s:e] = self.prefill(q[s:e], k[s:e], v[s:e], k_cache, v_cache, chunk)
        return out

    @staticmethod
    def _rows(slots: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """Rows of a cache viewed as [slots * KVH, Dh] for keys at `slots` ([..., L]), ordered
        [..., KVH, L]: gathered, they form one contiguous [L, Dh] matrix per head."""
        heads = torch.arange(num_kv_heads, device=slots.device)
        return (slots.unsqueeze(-2) * num_kv_heads + heads.unsqueeze(-1)).flatten()

    def _decode(self, q, k_cache, v_cache, meta: TorchAttentionMetadata) -> torch.Tensor:
        num_seqs, width = meta.decode_slots.shape
        kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
        if meta.decode_rows is None:
            meta.decode_rows = self._rows(meta.decode_slots, kv_heads)
            meta.decode_bias = _additive(meta.decode_mask, q.dtype)
            meta.decode_buffers = k_cache.new_empty(2, meta.decode_rows.numel(), head_dim)
        keys, values = meta.decode_buffers
        torch.index_select(k_cache.view(-1, head_dim), 0, meta.decode_rows, out=keys)
        torch.index_select(v_cache.view(-1, head_dim), 0, meta.decode_rows, out=values)
        shape = (num_seqs, kv_heads, width, head_dim)
        keys, values = keys.to(q.dtype), values.to(q.dtype)   # a cache stored narrower than the model computes
        # the query heads sharing a KV head are that head's queries: [D, KVH, H / KVH, Dh]
        out = F.scaled_dot_product_attention(q.reshape(num_seqs, kv_heads, -1, head_dim), keys.view(shape),
                                             values.view(shape), attn_mask=meta.decode_bias, scale=self.scale)
        return out.reshape(q.shape)   # CUDA's SDPA may return it in another memory order than the CPU's

    def prefill(self, q, k, v, k_cache, v_cache, chunk: PrefillChunk) -> torch.Tensor:
        """One chunk's attention (its K/V already in the cache); q/k/v: the chunk's rows."""
        kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
        if chunk.mask is not None and chunk.bias is None:
            chunk.bias = _additive(chunk.mask, q.dtype)
        if chunk.slots is None:   # a first chunk: its own keys are all there is
            return self._chunk_attention(q, k.transpose(0, 1), v.transpose(0, 1), chunk)
        if chunk.rows is None:
            chunk.rows = self._rows(chunk.slots, kv_heads)
        shape = (kv_heads, chunk.slots.shape[0], head_dim)
        # the chunk's own keys were just written, so one gather from the cache covers context and chunk
        keys = k_cache.view(-1, head_dim).index_select(0, chunk.rows).view(shape).to(q.dtype)
        values = v_cache.view(-1, head_dim).index_select(0, chunk.rows).view(shape).to(q.dtype)
        return self._chunk_attention(q, keys, values, chunk)

    def _chunk_attention(self, q, keys, values, chunk: PrefillChunk) -> torch.Tensor:
        """q [n, H, Dh] over the chunk's keys and values [KVH, L, Dh], causal (and windowed) as chunk.mask says."""
        return _grouped_sdpa(q, keys, values, chunk.bias, self.scale)


def _to(array: np.ndarray, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)


def block_table_matrix(layout: BatchLayout, width: int, dtype=np.int64) -> np.ndarray:
    """The decodes' block tables as one [decodes, width] matrix, padded with block 0."""
    tables = np.zeros((layout.num_decodes, width), dtype=dtype)
    for i in range(layout.num_decodes):
        table = layout.block_tables[i][:width]
        tables[i, :len(table)] = table
    return tables


def decode_keys(layout: BatchLayout, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The decodes' keys: cache slots [decodes, W] (padded with slot 0) and where they are attended, each
    decode's keys being its last `window` positions (all of them where window is None)."""
    lens = layout.seq_lens[:layout.num_decodes]
    starts = np.maximum(lens - window, 0) if window else np.zeros_like(lens)
    positions = starts[:, None] + np.arange(int((lens - starts).max()))
    tables = block_table_matrix(layout, -(-int(lens.max()) // layout.block_size))
    slots = np.take_along_axis(tables, positions // layout.block_size, axis=1) * layout.block_size
    attended = positions < lens[:, None]
    return np.where(attended, slots + positions % layout.block_size, 0), attended


def prefill_chunks(layout: BatchLayout, device: torch.device, window: int | None = None) -> list[PrefillChunk]:
    """Per prefill chunk of the step: the cache slots of its keys (context and chunk) and its mask: causal,
    and with a window, a query at position p sees keys (p - window, p]."""
    starts, chunks = layout.query_starts, []
    for i in range(layout.num_decodes, layout.num_seqs):
        ctx, n = int(layout.context_lens[i]), int(layout.query_lens[i])
        key_start = max(ctx - window + 1, 0) if window else 0   # keys before it no query of the chunk sees
        slots = _to(layout.slots(i, key_start, ctx + n), device) if ctx else None
        mask = None
        if ctx or (window and n > window):
            query_pos = torch.arange(ctx, ctx + n, device=device)[:, None]
            key_pos = torch.arange(key_start, ctx + n, device=device)[None, :]
            mask = key_pos <= query_pos
            if window:
                mask &= key_pos > query_pos - window
        chunks.append(PrefillChunk(int(starts[i]), n, ctx, slots, mask, key_start, window))
    return chunks


def prepare_step(backend: AttentionBackend, layout: BatchLayout, device: torch.device, window: int | None) -> Any:
    """A step's attention metadata, with meta.sliding for a model with sliding-window layers: the same
    object while no sequence of the step is longer than the window (full attention is the same there)."""
    meta = backend.prepare(layout, device)
    if window is not None:
        longest = int(layout.seq_lens.max()) if layout.num_seqs else 0
        meta.sliding = meta if longest <= window else backend.prepare(layout, device, window)
    return meta


def prepare_grouped_step(backend: AttentionBackend, layouts: list[BatchLayout], device: torch.device,
                         windows: list[int | None]) -> Any:
    """A step's attention metadata where the KV is in pages per layer group (engine/kv_cache/kv_groups.py): one
    per group, from the group's own block tables (`layouts`, group 0's first) and window (None: a global
    group); meta.groups lists them."""
    metas = [backend.prepare(layout, device, window) for layout, window in zip(layouts, windows)]
    metas[0].groups = metas
    return metas[0]


def _grouped_sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """Attention of one sequence's queries q [n, H, Dh] over keys/values [KVH, L, Dh]: causal when
    bias is None (L == n), else with the additive bias [n, L].

    Shaped as batch = KV head, heads = the query heads sharing it, with the keys broadcast over
    those heads (stride 0, no copy): 4-D, no enable_gqa, so CPU SDPA takes its flash kernel; 3-D
    or enable_gqa inputs fall back to the math kernel, 2-3x slower on a 512-token chunk.
    """
    n, num_heads, head_dim = q.shape
    kv_heads, length = keys.shape[0], keys.shape[1]
    group = num_heads // kv_heads
    shape = (kv_heads, group, length, head_dim)
    out = F.scaled_dot_product_attention(
        q.view(n, kv_heads, group, head_dim).permute(1, 2, 0, 3), keys.unsqueeze(1).expand(shape),
        values.unsqueeze(1).expand(shape), attn_mask=bias, is_causal=bias is None, scale=scale)
    return out.permute(2, 0, 1, 3).reshape(n, num_heads, head_dim)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as SDPA applies it (0 where attended, -inf elsewhere), made once
    per step instead of once per layer inside SDPA."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


BACKENDS = ("torch", "cpu", "triton", "auto")


def make_attention_backend(name: str, scale: float, device: str = "cpu",
                           dtype: torch.dtype = torch.float32) -> AttentionBackend:
    """Registry of attention backends by name. "auto": triton on CUDA when it imports; on the CPU the C
    kernel's decode attention (cpu_attention.py) for an fp32 model where its AVX2 code runs, else torch."""
    on_cuda = str(device).startswith("cuda")
    if name == "auto":
        if on_cuda:
            name = "triton" if _triton_available() else "torch"
        else:
            name = "cpu" if dtype == torch.float32 and fast_library() is not None else "torch"
    if name == "torch":
        return TorchAttention(scale)
    if name == "cpu":
        if on_cuda or dtype != torch.float32:
            raise ValueError(f"attention backend 'cpu' runs fp32 models on the CPU, not {dtype} on {device!r}; "
                             "use 'torch' or 'auto'")
        library = load_library()
        if library is None:
            raise ImportError("attention backend 'cpu' needs the CPU kernels, which were not built "
                              "(reinstall with pip install -e .); use 'torch' or 'auto'")
        from engine.attention.cpu_attention import CpuPagedAttention
        return CpuPagedAttention(scale, library)
    if name == "triton":
        if not _triton_available():
            raise ImportError("attention backend 'triton' needs the triton package: pip install 'triton>=3.1'")
        if not on_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"attention backend 'triton' runs on CUDA, not {device!r} "
                             "(on CPU only under TRITON_INTERPRET=1, for tests); use 'torch' or 'auto'")
        from engine.attention.triton_attention import TritonAttention  # lazy: triton is optional and slow to import
        return TritonAttention(scale)
    raise ValueError(f"unknown attention backend {name!r}: expected one of {', '.join(BACKENDS)}")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
