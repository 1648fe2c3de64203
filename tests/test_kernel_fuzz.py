"""Differential fuzz of every C kernel (engine/kernels/csrc) against numpy: random shapes, odd and tiny ones
included, every quantization type, every instruction set this CPU runs, batches of 1-300 rows,
paged attention over block tables with holes, strided and offset outputs.

Seeded and bounded: KERNEL_FUZZ_CASES cases per kernel (default 12, a few seconds), drawn from
KERNEL_FUZZ_SEED (default 0); a failure names its case, and
`KERNEL_FUZZ_SEED=S pytest tests/test_kernel_fuzz.py -k "matmul and 17"` replays it. Every buffer a
kernel reads or writes is allocated to the byte it may touch, so the sanitized build (.ci/sanitize,
which runs this file with many more cases under 1-4 pool threads: QLINEAR_THREADS) reports any
access past one, and outputs are surrounded by sentinels that must survive. Memory the kernel must not
read (cache slots past a sequence's length, blocks outside its table) holds NaN, which would reach
the output. The pool's own concurrency is checked by tests/test_thread_pool.py (ThreadSanitizer)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import zlib
from dataclasses import dataclass

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.attention.backends import HeadShape
from engine.kernels.cpu_kernels import ISAS, load_library
from engine.kernels.quantized_linear import QuantizedTensor, load_kernels
from tests import kernel_references as ref
from tests.test_quantized_linear import quantize_activations, random_blocks, reference_weights

CASES = int(os.environ.get("KERNEL_FUZZ_CASES", "12"))
SEED = int(os.environ.get("KERNEL_FUZZ_SEED", "0"))
LIBRARY, KERNELS = load_library(), load_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="CPU kernels not built")
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
SENTINEL = np.float32(-12345.5)


def isas_here() -> tuple[str, ...]:
    """The instruction sets this CPU runs (the GGUF-layout kernels treat avx512 as avx2)."""
    if LIBRARY is None:
        return ()
    here = tuple(isa for isa in ISAS if LIBRARY.set_isa(isa) == isa)
    LIBRARY.set_isa("best")
    return here


ISAS_HERE = isas_here()
if LIBRARY is not None:   # entry points called directly here (engine/attention/cpu_attention.py sets the same types)
    LIBRARY.lib.paged_decode_attention.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int] + [ctypes.c_void_p] * 3
                                                   + [ctypes.c_int64] * 6 + [ctypes.c_float])
GGUF_ISAS = tuple(i for i in ISAS_HERE if i != "avx512")
ptr = lambda a: a.ctypes.data  # noqa: E731


def rng_for(kernel: str, case: int) -> np.random.Generator:
    return np.random.default_rng([SEED, zlib.crc32(kernel.encode()), case])


def pick(options, case: int, period: int = 1):
    """Categorical choices cycle with the case number, so a few cases cover every combination."""
    return options[(case // period) % len(options)]


def batch_rows(rng: np.random.Generator) -> int:
    """1-300 rows: a decode batch's few, a chunk's tens, a prefill step's hundreds."""
    low, high = [(1, 9), (9, 41), (41, 301)][int(rng.integers(3))]
    return int(rng.integers(low, high))


def activations(rng: np.random.Generator, n: int, cols: int) -> np.ndarray:
    """Activations at a random scale, with an outlier channel and, sometimes, an all-zero block of 32."""
    x = (rng.standard_normal((n, cols)) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
    x[:, int(rng.integers(cols))] *= 30
    if rng.random() < 0.3:
        block = int(rng.integers(cols // 32))
        x[int(rng.integers(n)), block * 32:block * 32 + 32] = 0
    return x


@contextlib.contextmanager
def running(isa: str):
    assert LIBRARY.set_isa(isa) == isa
    try:
        yield
    finally:
        LIBRARY.set_isa("best")


@contextlib.contextmanager
def panel_rows(path: str):
    KERNELS.set_panel_rows(1 << 30 if path == "int16" else 1)
    try:
        yield
    finally:
        KERNELS.set_panel_rows(8)


# ---- linear layers on GGUF's blocks and on interleaved rows ----------------------------------------

@dataclass(frozen=True)
class MatmulCase:
    qtype: T
    rows: int
    cols: int
    n: int
    ldy: int       # output row stride
    col0: int      # first output column
    path: str      # int16 (16-bit dot products) or panel (fp32 tiles); the interleaved kernels have only int16
    isa: str
    interleaved: bool


def draw_matmul(case: int, interleaved: bool) -> MatmulCase:
    rng = rng_for("x16" if interleaved else "matmul", case)
    qtype = pick(TYPES, case)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    rows = 16 * int(rng.integers(1, 6)) if interleaved else int(rng.integers(1, 71))
    cols = block * int(rng.integers(1, 4 if block == 256 else 13))
    pad = int(rng.integers(0, 4))
    path = "int16" if interleaved else ("int16", "panel")[int(rng.integers(2))]
    isa = pick(ISAS_HERE if interleaved else GGUF_ISAS, case)   # 7 types against 2 or 3 ISAs: every pair
    return MatmulCase(qtype, rows, cols, batch_rows(rng), rows + pad, int(rng.integers(0, pad + 1)), path, isa,
                      interleaved)


def run_matmul(c: MatmulCase, w: QuantizedTensor, x: np.ndarray) -> np.ndarray:
    """y = x @ W^T into a buffer holding exactly the rows the kernel may write (row stride ldy from
    column col0); everything else in it must keep the sentinel."""
    buf = np.full(c.col0 + (c.n - 1) * c.ldy + c.rows, SENTINEL, dtype=np.float32)
    args = (int(c.qtype), w.data.data_ptr(), c.rows, c.cols, ptr(x), c.n, ptr(buf) + 4 * c.col0, c.ldy)
    with running(c.isa), panel_rows(c.path):
        rc = KERNELS.lib.qlin_x16_matmul(*args, 0) if c.interleaved else KERNELS.lib.qlin_matmul(*args)
    assert rc == 0, c
    written = c.col0 + np.arange(c.n)[:, None] * c.ldy + np.arange(c.rows)[None, :]
    outside = np.ones(buf.size, dtype=bool)
    outside[written.ravel()] = False
    assert (buf[outside] == SENTINEL).all(), f"{c}: wrote outside its output"
    return buf[written].astype(np.float64)


def assert_matmul_close(c: MatmulCase, got: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """Bounds of tests/test_quantized_linear.py: fp32 accumulation on the activations as the path sees
    them (exact on panels, rounded to 16 bits per block of 32 on the int16 path)."""
    seen = x.astype(np.float64) if c.path == "panel" else quantize_activations(x)[0]
    slack = 1e-5 * (np.abs(seen) @ np.abs(w).T) + 1e-6 * max(1.0, float(np.abs(seen).max()))
    err = np.abs(got - seen @ w.T)
    assert (err <= slack).all(), f"{c}: worst error {err.max():.3g} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("case", range(CASES))
def test_matmul(case):
    c = draw_matmul(case, interleaved=False)
    rng = rng_for("matmul-data", case)
    data = random_blocks(c.qtype, c.rows, c.cols, seed=int(rng.integers(1 << 30)))
    w = QuantizedTensor.from_numpy(int(c.qtype), c.rows, c.cols, data)
    x = activations(rng, c.n, c.cols)
    assert_matmul_close(c, run_matmul(c, w, x), x, reference_weights(c.qtype, data, c.rows, c.cols))


@pytest.mark.parametrize("case", range(CASES))
def test_interleaved_matmul_and_dequantize(case):
    c = draw_matmul(case, interleaved=True)
    rng = rng_for("x16-data", case)
    data = random_blocks(c.qtype, c.rows, c.cols, seed=int(rng.integers(1 << 30)))
    with running(c.isa):
        w = KERNELS.interleave(QuantizedTensor.from_numpy(int(c.qtype), c.rows, c.cols, data))
    assert w.data.numel() == w.nbytes
    dense = reference_weights(c.qtype, data, c.rows, c.cols)
    x = activations(rng, c.n, c.cols)
    assert_matmul_close(c, run_matmul(c, w, x), x, dense)
    # rows by id (repeats allowed) and a range starting anywhere, each exactly GGUF's dequantization
    ids = rng.integers(0, c.rows, size=int(rng.integers(1, 2 * c.rows)))
    row0 = int(rng.integers(c.rows))
    count = int(rng.integers(1, c.rows - row0 + 1))
    with running(c.isa):
        picked, ranged = torch.empty(len(ids), c.cols), torch.empty(count, c.cols)
        KERNELS.dequantize_into(w, picked, ids=torch.from_numpy(ids))
        KERNELS.dequantize_into(w, ranged, row0=row0, rows=count)
    np.testing.assert_array_equal(picked.numpy(), dense[ids].astype(np.float32), err_msg=str(c))
    np.testing.assert_array_equal(ranged.numpy(), dense[row0:row0 + count].astype(np.float32), err_msg=str(c))


@pytest.mark.parametrize("case", range(CASES))
def test_dequantize(case):
    rng = rng_for("dequantize", case)
    qtype, isa = pick(TYPES, case), pick(GGUF_ISAS, case)
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    rows, cols = int(rng.integers(1, 41)), block * int(rng.integers(1, 4 if block == 256 else 13))
    data = random_blocks(qtype, rows, cols, seed=case)
    w = QuantizedTensor.from_numpy(int(qtype), rows, cols, data)
    ids = rng.integers(0, rows, size=int(rng.integers(1, 2 * rows + 1)))
    pad = int(rng.integers(0, 3))
    out = np.full(len(ids) * (cols + pad), SENTINEL, dtype=np.float32)
    with running(isa):
        rc = KERNELS.lib.qlin_dequantize(int(qtype), w.data.data_ptr(), len(ids), cols,
                                         torch.from_numpy(ids).data_ptr(), ptr(out), cols + pad)
    assert rc == 0
    out = out.reshape(len(ids), cols + pad)
    expected = reference_weights(qtype, data, rows, cols)[ids]
    case_id = f"{qtype.name} rows={rows} cols={cols} ids={len(ids)} pad={pad} {isa}"
    assert np.abs(out[:, :cols] - expected).max() <= 1e-6 * max(np.abs(expected).max(), 1e-30), case_id
    assert (out[:, cols:] == SENTINEL).all(), case_id


# ---- paged decode attention ------------------------------------------------------------------------

@dataclass(frozen=True)
class AttentionCase:
    lens: tuple[int, ...]
    heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    holes: int           # blocks in the pool that no sequence owns (NaN)
    pad: int             # table entries past the blocks a sequence uses (garbage block numbers)
    kv_fp16: bool
    isa: str


def draw_attention(case: int) -> AttentionCase:
    rng = rng_for("attention", case)
    kv_heads, group = int(rng.integers(1, 5)), int(rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 16]))
    seqs = int(rng.integers(1, 13))
    lens = tuple(int(rng.choice([1, rng.integers(1, 20), rng.integers(1, 301)])) for _ in range(seqs))
    return AttentionCase(lens, kv_heads * group, kv_heads, int(rng.choice([1, 2, 3, 7, 8, 16, 24, 40, 64, 72, 128])),
                         int(rng.integers(1, 18)), int(rng.integers(0, 2 * seqs + 3)), int(rng.integers(0, 4)),
                         bool(case % 2), pick(GGUF_ISAS, case, 2))


def attention_inputs(c: AttentionCase, rng: np.random.Generator):
    """(q, k_cache, v_cache, tables, lens): each sequence's blocks scattered over a pool with holes;
    every slot no sequence attends to (holes, tails of last blocks) NaN."""
    needed = [-(-n // c.block_size) for n in c.lens]
    num_blocks = sum(needed) + c.holes
    order = rng.permutation(num_blocks).astype(np.int32)
    width = max(needed) + c.pad
    garbage = np.array([-1, num_blocks, np.iinfo(np.int32).max], dtype=np.int32)
    tables = garbage[rng.integers(0, 3, size=(len(c.lens), width))]
    dtype = np.float16 if c.kv_fp16 else np.float32
    shape = (num_blocks * c.block_size, c.kv_heads, c.head_dim)
    k_cache, v_cache = np.full(shape, np.nan, dtype=dtype), np.full(shape, np.nan, dtype=dtype)
    used = 0
    for s, (n, blocks) in enumerate(zip(c.lens, needed)):
        tables[s, :blocks] = order[used:used + blocks]
        used += blocks
        t = np.arange(n)
        slots = tables[s, t // c.block_size].astype(np.int64) * c.block_size + t % c.block_size
        k_cache[slots] = rng.standard_normal((n, c.kv_heads, c.head_dim))
        v_cache[slots] = rng.standard_normal((n, c.kv_heads, c.head_dim))
    q = (rng.standard_normal((len(c.lens), c.heads, c.head_dim)) * 3).astype(np.float32)
    return q, k_cache, v_cache, tables, np.array(c.lens, dtype=np.int32)


@pytest.mark.parametrize("case", range(CASES))
def test_paged_decode_attention(case):
    c = draw_attention(case)
    q, k_cache, v_cache, tables, lens = attention_inputs(c, rng_for("attention-data", case))
    out = np.empty_like(q)
    scale = c.head_dim ** -0.5
    with running(c.isa):
        rc = LIBRARY.lib.paged_decode_attention(ptr(q), ptr(k_cache), ptr(v_cache), int(c.kv_fp16), ptr(tables),
                                                ptr(lens), ptr(out), len(c.lens), c.heads, c.kv_heads, c.head_dim,
                                                c.block_size, tables.shape[1], scale)
    assert rc == 0, c
    expected = ref.paged_attention(q, k_cache, v_cache, tables, lens, c.block_size, scale)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-4, err_msg=str(c))


def test_paged_decode_attention_rejects_what_it_cannot_run():
    """A sequence with no key, more than 64 query heads per KV head, heads not a multiple of KV heads:
    an error code, and nothing read."""
    q, out = np.zeros(130, dtype=np.float32), np.zeros(130, dtype=np.float32)
    lens, table = np.array([0], dtype=np.int32), np.array([-1], dtype=np.int32)
    call = LIBRARY.lib.paged_decode_attention
    assert call(ptr(q), None, None, 0, ptr(table), ptr(lens), ptr(out), 1, 2, 1, 1, 16, 1, 1.0) == -2
    lens[0] = 1
    assert call(ptr(q), None, None, 0, ptr(table), ptr(lens), ptr(out), 1, 65, 1, 2, 16, 1, 1.0) == -1
    assert call(ptr(q), None, None, 0, ptr(table), ptr(lens), ptr(out), 1, 5, 2, 2, 16, 1, 1.0) == -1


# ---- rotary embedding + KV write, RMSNorm, SiLU * up ------------------------------------------------

@pytest.mark.parametrize("case", range(CASES))
def test_rope_store(case):
    rng = rng_for("rope", case)
    kv_heads, group = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    heads, dim = kv_heads * group, 2 * int(rng.choice([1, 3, 4, 8, 12, 32, 64]))
    tokens = int(rng.integers(1, 41))
    cache_slots = tokens + int(rng.integers(0, 20))
    width = (heads + 2 * kv_heads) * dim
    ld = width + int(rng.integers(0, 5))
    fp16, isa = bool(case % 2), pick(GGUF_ISAS, case, 2)
    case_id = f"tokens={tokens} heads={heads}/{kv_heads} dim={dim} ld={ld} fp16={fp16} {isa}"
    flat = (rng.standard_normal((tokens - 1) * ld + width) * 3).astype(np.float32)   # exactly the rows read
    qkv = torch.from_numpy(flat).as_strided((tokens, width), (ld, 1))
    cos, sin = (torch.from_numpy(rng.uniform(-1, 1, (tokens, dim)).astype(np.float32)) for _ in range(2))
    slots = torch.from_numpy(rng.permutation(cache_slots)[:tokens].astype(np.int64))
    dtype = torch.float16 if fp16 else torch.float32
    k_cache = torch.full((cache_slots, kv_heads, dim), 7.0, dtype=dtype)
    v_cache = k_cache.clone()
    with running(isa):
        q = LIBRARY.rope_store(qkv, HeadShape(heads, kv_heads, dim), cos, sin, slots, k_cache, v_cache)
    x = qkv.numpy().astype(np.float64)
    c, s = cos.numpy()[:, None, :].astype(np.float64), sin.numpy()[:, None, :].astype(np.float64)
    rotated = ref.rotate_half(x[:, :(heads + kv_heads) * dim].reshape(tokens, heads + kv_heads, dim), c, s)
    np.testing.assert_allclose(q.numpy(), rotated[:, :heads], atol=1e-5, rtol=1e-5, err_msg=case_id)
    untouched = np.setdiff1d(np.arange(cache_slots), slots.numpy())
    values = x[:, (heads + kv_heads) * dim:width].reshape(tokens, kv_heads, dim)
    np.testing.assert_allclose(k_cache[slots].float().numpy(), rotated[:, heads:], atol=1e-5 if not fp16 else 2e-3,
                               rtol=1e-3, err_msg=case_id)
    np.testing.assert_array_equal(v_cache[slots].numpy(), values.astype(np.float32).astype(k_cache.numpy().dtype),
                                  err_msg=case_id)
    assert (k_cache[untouched] == 7).all() and (v_cache[untouched] == 7).all(), case_id


def test_rope_store_rejects_an_odd_head_dim():
    heads = HeadShape(1, 1, 3)
    qkv, cache = torch.zeros(1, 9), torch.zeros(1, 1, 3)
    with pytest.raises(ValueError, match="odd"):
        LIBRARY.rope_store(qkv, heads, torch.zeros(1, 3), torch.zeros(1, 3), torch.zeros(1, dtype=torch.int64),
                           cache, cache.clone())


@pytest.mark.parametrize("case", range(CASES))
def test_add_rms_norm(case):
    rng = rng_for("rms_norm", case)
    rows, d, isa = batch_rows(rng), int(rng.choice([1, 3, 8, 15, 16, 17, 40, 64, 576, 700])), pick(GGUF_ISAS, case)
    h = torch.from_numpy((rng.standard_normal((rows, d)) * 4).astype(np.float32))
    delta = torch.from_numpy(rng.standard_normal((rows, d)).astype(np.float32)) if case % 3 else None
    weight = torch.from_numpy(rng.standard_normal(d).astype(np.float32))
    eps = float(rng.choice([1e-6, 1e-5]))
    h_before = h.numpy().copy()
    with running(isa):
        out = LIBRARY.add_rms_norm(h, delta, weight, eps)
    summed, expected = ref.add_rms_norm(h_before, None if delta is None else delta.numpy(), weight.numpy(), eps)
    case_id = f"rows={rows} d={d} delta={delta is not None} {isa}"
    np.testing.assert_array_equal(h.numpy(), summed.astype(np.float32), err_msg=case_id)   # one fp32 add
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5, rtol=1e-5, err_msg=case_id)


@pytest.mark.parametrize("case", range(CASES))
def test_silu_mul(case):
    rng = rng_for("silu", case)
    n, inter, isa = batch_rows(rng), int(rng.integers(1, 300)), pick(GGUF_ISAS, case)
    gu = (rng.standard_normal((n, 2 * inter)) * 6).astype(np.float32)
    edges = np.array([-200.0, -88.5, -30.0, -1e-6, 0.0, 1e-6, 30.0, 200.0], dtype=np.float32)
    gu[0, :min(inter, 8)] = edges[:min(inter, 8)]
    y = np.full(n * inter, SENTINEL, dtype=np.float32)
    with running(isa):
        LIBRARY.lib.silu_mul(ctypes.c_void_p(ptr(gu)), ctypes.c_int64(n), ctypes.c_int64(inter), ctypes.c_void_p(ptr(y)))
    np.testing.assert_allclose(y.reshape(n, inter), ref.silu_mul(gu), rtol=1e-5, atol=1e-30,
                               err_msg=f"n={n} inter={inter} {isa}")


# ---- a whole decoder layer in one call -------------------------------------------------------------

@dataclass(frozen=True)
class LayerCase:
    parts: tuple[tuple[T, ...], ...]   # per projection (qkv, o, gate_up, down): its parts' types
    bias: bool                         # on q/k/v, as Qwen2's
    interleaved: bool
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    lens: tuple[int, ...]              # keys each decode attends to, its new token's included
    block_size: int
    kv_fp16: bool
    isa: str


def draw_layer(case: int) -> LayerCase:
    """Small layers whose every width is whole blocks (256 columns for K-quants) and whole groups of 16
    rows; fused q/k/v and gate/up in one part or split into parts of different types."""
    rng = rng_for("layer", case)
    k_quants = case % 4 == 3
    types = TYPES[4:] if k_quants else TYPES[:4]
    kv_heads, group = (1, 4) if k_quants else (int(rng.integers(1, 3)), int(rng.integers(1, 4)))
    head_dim = 64 if k_quants else int(rng.choice([32, 64]))
    dims = [256] if k_quants else [32, 64, 96]

    def split(count: int) -> tuple[T, ...]:
        return tuple(types[int(i)] for i in rng.integers(0, len(types), size=int(rng.choice([1, count]))))

    n = int(rng.integers(1, 25))
    lens = tuple(int(rng.integers(1, 120)) for _ in range(n))
    isa = pick(ISAS_HERE if case % 2 else GGUF_ISAS, case // 2)
    return LayerCase((split(3), split(1), split(2), split(1)), bool(rng.integers(2)), bool(case % 2),
                     int(rng.choice(dims)), kv_heads * group, kv_heads, head_dim, int(rng.choice(dims)), lens,
                     int(rng.integers(1, 17)), bool(rng.integers(2)), isa)


def projection(types: tuple[T, ...], rows: list[int], cols: int, bias: bool, interleaved: bool,
               rng: np.random.Generator):
    """A QuantizedLinear of `rows` split into len(types) parts (one part: all rows in the first type)."""
    from engine.kernels.quantized_linear import QuantizedLinear, QuantizedPath
    rows = rows if len(types) == len(rows) else [sum(rows)]
    parts = []
    for qtype, r in zip(types, rows):
        w = QuantizedTensor.from_numpy(int(qtype), r, cols, random_blocks(qtype, r, cols, int(rng.integers(1 << 20))))
        parts.append(KERNELS.interleave(w) if interleaved else w)
    b = torch.from_numpy(rng.standard_normal(sum(rows)).astype(np.float32)) if bias else None
    return QuantizedLinear(parts, b, QuantizedPath(KERNELS, max_rows=1 << 20))


def chained_layer(c: LayerCase, proj, norms, h, x, cos, sin, slots, caches, tables, lens, scale):
    """The layer as the model's Python path runs it: one library call per op."""
    n = len(c.lens)
    q = LIBRARY.rope_store(proj[0](x), HeadShape(c.heads, c.kv_heads, c.head_dim), cos, sin, slots, *caches)
    attn = np.empty((n, c.heads, c.head_dim), dtype=np.float32)
    assert LIBRARY.lib.paged_decode_attention(
        q.data_ptr(), caches[0].data_ptr(), caches[1].data_ptr(), int(c.kv_fp16), ptr(tables), ptr(lens), ptr(attn),
        n, c.heads, c.kv_heads, c.head_dim, c.block_size, tables.shape[1], scale) == 0
    x = LIBRARY.add_rms_norm(h, proj[1](torch.from_numpy(attn.reshape(n, -1))), norms[0], 1e-5)
    gate_up, act = proj[2](x), np.empty((n, c.inter), dtype=np.float32)
    LIBRARY.lib.silu_mul(ctypes.c_void_p(gate_up.data_ptr()), ctypes.c_int64(n), ctypes.c_int64(c.inter),
                         ctypes.c_void_p(ptr(act)))
    return LIBRARY.add_rms_norm(h, proj[3](torch.from_numpy(act)), norms[1], 1e-5)


@pytest.mark.parametrize("case", range(CASES))
def test_decode_layer_matches_its_kernels_one_by_one(case):
    """engine/kernels/csrc/decode_layer.c chains the kernels fuzzed above: the same results as the Python path's
    calls one by one, from scratch buffers of exactly the sizes engine/model/cpu_decode.py allocates."""
    from engine.model.cpu_decode import DecodeStep, LayerParams, qproj
    c = draw_layer(case)
    rng = rng_for("layer-data", case)
    n, q_rows, kv_rows = len(c.lens), c.heads * c.head_dim, c.kv_heads * c.head_dim
    with running(c.isa):
        proj = [projection(c.parts[0], [q_rows, kv_rows, kv_rows], c.hidden, c.bias, c.interleaved, rng),
                projection(c.parts[1], [c.hidden], q_rows, False, c.interleaved, rng),
                projection(c.parts[2], [c.inter, c.inter], c.hidden, False, c.interleaved, rng),
                projection(c.parts[3], [c.hidden], c.inter, False, c.interleaved, rng)]
        attention = AttentionCase(c.lens, c.heads, c.kv_heads, c.head_dim, c.block_size, 2, 1, c.kv_fp16, c.isa)
        _, k_cache, v_cache, tables, lens = attention_inputs(attention, rng)
        t = np.array(c.lens) - 1          # each decode's new token: the last slot it attends to, NaN until written
        slots = torch.from_numpy(tables[np.arange(n), t // c.block_size].astype(np.int64) * c.block_size
                                 + t % c.block_size)
        k_cache[slots.numpy()] = v_cache[slots.numpy()] = np.nan
        norms = [torch.from_numpy(rng.uniform(0.5, 1.5, c.hidden).astype(np.float32)) for _ in range(2)]
        h = torch.from_numpy(rng.standard_normal((n, c.hidden)).astype(np.float32))
        x = torch.from_numpy(rng.standard_normal((n, c.hidden)).astype(np.float32))
        cos, sin = (torch.from_numpy(rng.uniform(-1, 1, (n, c.head_dim)).astype(np.float32)) for _ in range(2))
        scale = c.head_dim ** -0.5
        caches = [torch.from_numpy(k_cache.copy()), torch.from_numpy(v_cache.copy())]
        h_chain = h.clone()
        expected = chained_layer(c, proj, norms, h_chain, x.clone(), cos, sin, slots, caches, tables, lens, scale)

        params = LayerParams(*map(qproj, proj), norms[0].data_ptr(), norms[1].data_ptr(), 1e-5, c.hidden, c.heads,
                             c.kv_heads, c.head_dim, c.inter)
        scratch = [np.empty(n * width, dtype=np.float32) for width in
                   (proj[0].out_features, q_rows, q_rows, c.hidden, 2 * c.inter, c.inter)]
        step = DecodeStep(n, cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), ptr(tables), ptr(lens), c.block_size,
                          tables.shape[1], scale, int(c.kv_fp16), *map(ptr, scratch))
        LIBRARY.lib.decode_layer.argtypes = [ctypes.POINTER(LayerParams), ctypes.POINTER(DecodeStep)] + [ctypes.c_void_p] * 4
        rc = LIBRARY.lib.decode_layer(ctypes.byref(params), ctypes.byref(step), h.data_ptr(), x.data_ptr(),
                                      ptr(k_cache), ptr(v_cache))
    assert rc == 0, c
    torch.testing.assert_close(h, h_chain, rtol=1e-6, atol=1e-6, msg=lambda m: f"{c}: {m}")
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-6, msg=lambda m: f"{c}: {m}")
    np.testing.assert_array_equal(k_cache, caches[0].numpy(), err_msg=str(c))
    np.testing.assert_array_equal(v_cache, caches[1].numpy(), err_msg=str(c))
