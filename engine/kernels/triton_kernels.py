"""Triton kernels over the paged KV cache, and thin launch wrappers.

Three kernels: the KV write by slot, paged decode attention (one query token per sequence) and
varlen prefill attention (chunks attending causally to their cached context plus themselves).
Both attention kernels read every key, old or new, from the paged cache through the block table,
so the write must run first; they share the online-softmax tile loop below.

Conventions, kept for the CPU interpreter (TRITON_INTERPRET=1) as much as for the GPU:
- pointer arithmetic with tl.arange and masks (no tl.make_block_ptr, gone in Triton 3.9);
- under the interpreter every load is upcast to fp32 at once (it computes bf16 wrongly otherwise); on the
  GPU 16-bit q/k/v enter the dots as stored (_native_dot);
- fixed block sizes, no autotuning; head_dim is padded to a power of two and masked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DECODE_BLOCK_N = 64     # keys per tile in decode
PREFILL_BLOCK_M = 64    # query rows per program in prefill
PREFILL_BLOCK_N = 64    # keys per tile in prefill
MIN_DOT_ROWS = 16       # tl.dot needs at least 16 rows on the GPU; decode pads its query heads to it
LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                     stride_kt, stride_kh, stride_vt, stride_vh, stride_cs, stride_ch,
                     NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per token: copy its [KVH, D] keys and values to its cache slot. A negative slot is a
    padding row (a CUDA graph captured for more sequences than the step has) and writes nothing."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    cache_offs = slot * stride_cs + heads * stride_ch + dims
    k = tl.load(k_ptr + t * stride_kt + heads * stride_kh + dims, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + cache_offs, k, mask=mask)
    tl.store(v_cache_ptr + cache_offs, v, mask=mask)


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_row_ptr, key_start,
                 rows_last_key, seq_len, kv_head, stride_cs, stride_ch, qk_scale,
                 BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr, NATIVE_DOT: tl.constexpr):
    """One online-softmax step over keys [key_start, key_start + BLOCK_N) gathered by block table.

    rows_last_key: [rows] the last key position each query row may attend to (causal limit).
    NATIVE_DOT: q, k, v and p enter the dots in the cache's 16-bit type (fp32 accumulation), as FlashAttention
    does; else everything is upcast to fp32 (see _dot_precision).
    """
    keys = key_start + tl.arange(0, BLOCK_N)
    key_valid = keys < seq_len
    block_ids = tl.load(block_table_row_ptr + keys // BLOCK_SIZE, mask=key_valid, other=0).to(tl.int64)
    slots = block_ids * BLOCK_SIZE + keys % BLOCK_SIZE
    dims = tl.arange(0, BLOCK_D)
    kv_offs = slots[:, None] * stride_cs + kv_head * stride_ch + dims[None, :]
    kv_mask = key_valid[:, None] & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
    if NATIVE_DOT:
        s = tl.dot(q, tl.trans(k)) * qk_scale   # [rows, BLOCK_N], log2 units
    else:
        k, v = k.to(tl.float32), v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    allowed = key_valid[None, :] & (keys[None, :] <= rows_last_key[:, None])
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if NATIVE_DOT:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    else:   # p is computed in fp32: a tf32 dot rounds it to a 10-bit mantissa (see _dot_precision)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _decode_kernel(q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
                   stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt, qk_scale,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   DOT_PRECISION: tl.constexpr, NATIVE_DOT: tl.constexpr):
    """One program per (decode sequence, kv head): its GROUP query heads share each loaded key tile."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    heads = kv_head * GROUP + tl.arange(0, BLOCK_G)
    head_valid = tl.arange(0, BLOCK_G) < GROUP
    dims = tl.arange(0, BLOCK_D)
    q_mask = head_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=q_mask, other=0.0)
    if not NATIVE_DOT:
        q = q.to(tl.float32)

    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], -1e30, dtype=tl.float32)   # finite, so all-masked tiles give no NaN
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    last_key = tl.zeros([BLOCK_G], dtype=tl.int32) + seq_len - 1   # no causal limit: the token is last
    for key_start in range(0, seq_len, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bt,
                                     key_start, last_key, seq_len, kv_head, stride_cs, stride_ch, qk_scale,
                                     BLOCK_SIZE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PRECISION, NATIVE_DOT)
    out = acc / l_i[:, None]
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


@triton.jit
def _prefill_kernel(q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_starts_ptr,
                    query_lens_ptr, context_lens_ptr, first_seq,
                    stride_qt, stride_qh, stride_ot, stride_oh, stride_cs, stride_ch, stride_bt, qk_scale,
                    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, NATIVE_DOT: tl.constexpr):
    """One program per (chunk, query head, tile of BLOCK_M query rows); keys come from the cache."""
    seq = first_seq + tl.program_id(0)
    head = tl.program_id(1)
    row_start = tl.program_id(2) * BLOCK_M
    query_len = tl.load(query_lens_ptr + seq)
    if row_start >= query_len:   # the grid covers the longest chunk; shorter ones stop early
        return
    query_start = tl.load(query_starts_ptr + seq)
    context_len = tl.load(context_lens_ptr + seq)
    kv_head = head // GROUP

    rows = row_start + tl.arange(0, BLOCK_M)
    row_valid = rows < query_len
    dims = tl.arange(0, BLOCK_D)
    q_offs = (query_start + rows)[:, None].to(tl.int64) * stride_qt + head * stride_qh + dims[None, :]
    q_mask = row_valid[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + q_offs, mask=q_mask, other=0.0)
    if not NATIVE_DOT:
        q = q.to(tl.float32)

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    last_key = context_len + rows                        # causal with offset context_len
    key_end = context_len + tl.minimum(row_start + BLOCK_M, query_len)   # keys past this row tile are masked
    for key_start in range(0, key_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_tables_ptr + seq * stride_bt,
                                     key_start, last_key, key_end, kv_head, stride_cs, stride_ch, qk_scale,
                                     BLOCK_SIZE, HEAD_DIM, BLOCK_N, BLOCK_D, DOT_PRECISION, NATIVE_DOT)
    out = acc / tl.where(row_valid, l_i, 1.0)[:, None]
    o_offs = (query_start + rows)[:, None].to(tl.int64) * stride_ot + head * stride_oh + dims[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def _block_d(head_dim: int) -> int:
    """head_dim padded to a power of two, and to tl.dot's minimum of 16 on the GPU."""
    return max(16, triton.next_power_of_2(head_dim))


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 caches get IEEE fp32 dots. 16-bit caches get tf32 (tensor cores): q, k and v, 16-bit
    values upcast to fp32, are exact in tf32, so q.k^T loses nothing; but p.v rounds the softmax
    probabilities p, computed in fp32, to tf32's 10-bit mantissa (relative error up to 2^-11 per
    probability): no more than the rounding of the 16-bit output itself (2^-8 for bf16, 2^-11 for
    fp16) and finer than FlashAttention's cast of p to the 16-bit type, but not exact fp32."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _native_dot(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """16-bit queries and cache on the GPU: the dots take them as stored (tensor cores at the 16-bit rate,
    twice tf32's; p rounded to the 16-bit type as FlashAttention rounds it). The interpreter upcasts all."""
    return q.is_cuda and q.dtype == k_cache.dtype and q.dtype in (torch.bfloat16, torch.float16)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k, v: [T, KVH, D] -> caches [slots, KVH, D] at slot_mapping [T] (int32)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert k.stride(-1) == v.stride(-1) == k_cache.stride(-1) == 1
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=_block_d(head_dim))


def paged_decode(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, scale: float) -> None:
    """q, out: [S, H, D], one token per sequence; block_tables [S, max_blocks], seq_lens [S] (int32)."""
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    if num_seqs == 0:
        return
    group = num_heads // num_kv_heads
    _decode_kernel[(num_seqs, num_kv_heads)](
        q, out, k_cache, v_cache, block_tables, seq_lens, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), block_tables.stride(0), scale * LOG2E,
        GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_G=max(MIN_DOT_ROWS, triton.next_power_of_2(group)), BLOCK_N=DECODE_BLOCK_N,
        BLOCK_D=_block_d(head_dim), DOT_PRECISION=_dot_precision(k_cache.dtype),
        NATIVE_DOT=_native_dot(q, k_cache))


def varlen_prefill(q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, query_starts: torch.Tensor, query_lens: torch.Tensor,
                   context_lens: torch.Tensor, first_seq: int, num_seqs: int, max_query_len: int,
                   block_size: int, scale: float) -> None:
    """Chunks of sequences [first_seq, first_seq + num_seqs) of the flattened q/out [T, H, D].

    Their keys and values (context and chunk) must already be in the cache.
    """
    if num_seqs == 0:
        return
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[1]
    grid = (num_seqs, num_heads, triton.cdiv(max_query_len, PREFILL_BLOCK_M))
    _prefill_kernel[grid](
        q, out, k_cache, v_cache, block_tables, query_starts, query_lens, context_lens, first_seq,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        block_tables.stride(0), scale * LOG2E, GROUP=group, BLOCK_SIZE=block_size, HEAD_DIM=head_dim,
        BLOCK_M=PREFILL_BLOCK_M, BLOCK_N=PREFILL_BLOCK_N, BLOCK_D=_block_d(head_dim),
        DOT_PRECISION=_dot_precision(k_cache.dtype), NATIVE_DOT=_native_dot(q, k_cache))
