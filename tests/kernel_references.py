"""numpy references for the C kernels' non-matmul ops (the matmul references are in
tests/test_quantized_linear.py): float64, written from the math, not from the kernels' code, so the
differential fuzz (tests/test_kernel_fuzz.py) compares two independent implementations."""

from __future__ import annotations

import numpy as np


def paged_attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, tables: np.ndarray,
                    lens: np.ndarray, block_size: int, scale: float) -> np.ndarray:
    """softmax(q . K^T * scale) V per decode sequence and head; q [seqs, heads, d], caches
    [slots, kv_heads, d], tables [seqs, width] of block numbers, lens [seqs] keys per sequence."""
    seqs, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    out = np.empty((seqs, heads, d))
    for s in range(seqs):
        t = np.arange(int(lens[s]))
        slots = tables[s, t // block_size].astype(np.int64) * block_size + t % block_size
        keys, values = k_cache[slots].astype(np.float64), v_cache[slots].astype(np.float64)   # [n, kvh, d]
        qs = q[s].astype(np.float64).reshape(kv_heads, group, d)
        scores = np.einsum("kgd,nkd->kgn", qs, keys) * scale
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[s] = np.einsum("kgn,nkd->kgd", p, values).reshape(heads, d)
    return out


def rotate_half(x: np.ndarray, cos: np.ndarray, signed_sin: np.ndarray) -> np.ndarray:
    """x * cos + roll(x, d/2) * signed_sin over the last axis (Hugging Face's rotate-half, with the first
    half of the sine negated as engine/attention/rope.py stores it); cos/sin broadcast over the heads axis."""
    return x * cos + np.roll(x, x.shape[-1] // 2, axis=-1) * signed_sin


def add_rms_norm(h: np.ndarray, delta: np.ndarray | None, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(h + delta, RMSNorm(h + delta) * weight) in float64."""
    summed = h.astype(np.float64) + (0 if delta is None else delta.astype(np.float64))
    return summed, summed / np.sqrt((summed ** 2).mean(axis=-1, keepdims=True) + eps) * weight


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """SiLU(gate) * up for rows [gate | up]."""
    gate, up = np.split(gate_up.astype(np.float64), 2, axis=-1)
    return gate / (1 + np.exp(-gate)) * up


def prefill_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, q_pos0: int, k_pos0: int,
                      window: int | None, scale: float) -> np.ndarray:
    """Causal softmax(q . K^T * scale) V of a prefill chunk; q [n, heads, d], keys/values [kv_heads, L, d];
    query i at position q_pos0 + i sees the keys at positions k_pos0 + j <= its own (and > its own - window)."""
    n, heads, d = q.shape
    kv_heads, length = keys.shape[:2]
    q_pos = q_pos0 + np.arange(n)[:, None]
    k_pos = k_pos0 + np.arange(length)[None, :]
    seen = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window else True)
    out = np.empty((n, heads, d))
    for h in range(heads):
        kvh = h // (heads // kv_heads)
        scores = q[:, h].astype(np.float64) @ keys[kvh].astype(np.float64).T * scale
        scores = np.where(seen, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ values[kvh].astype(np.float64)
    return out
