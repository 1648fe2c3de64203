"""Linear layers and embeddings on a GGUF's quantized weights, in GGUF's own block layout or interleaved.

The kernels are engine/kernels/csrc/qlinear.c, in the library of engine/kernels/cpu_kernels.py. A decode step
streams every weight once: Q4_1's 0.625 bytes per weight instead of fp32's 4 is what makes it
faster, so the kernels run steps of up to `max_rows` rows (16-bit dot products below PANEL_ROWS
rows, fp32 tiles on panels dequantized into L1 from there). Where the CPU has AVX2 (and faster
with AVX-512 VNNI), the loader interleaves the rows of every type (Q4_0/Q4_1/Q5_0/Q8_0 and the
K-quants Q4_K/Q5_K/Q6_K) in groups of 16 for engine/kernels/csrc/qlinear_x16.c, whose 16-bit products run at
every row count (`QuantKernels.interleave`).
A larger step may go faster on torch's GEMM (fp32, or bf16 on AMX: dense_gemm_dtype); those steps
dequantize each weight (a chunk at a time, into a reused buffer) and call torch's matmul, so no dense copy
of the model is kept.
`measure_crossover` picks `max_rows` on the machine.

Where the library was not built or the CPU lacks AVX2/FMA/F16C, `load_kernels` says so once in the
log and the loader falls back to dequantized weights.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.kernels.cpu_kernels import CpuLibrary, load_library

log = logging.getLogger(__name__)

# GGML type id -> (name, elements per block, bytes per block): the types the kernels run
QUANT_TYPES: dict[int, tuple[str, int, int]] = {
    2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}
# GGML type id -> bytes per row and block on interleaved rows (engine/kernels/csrc/qlinear_x16.c): GGUF's own for
# Q4_0/Q4_1/Q5_0/Q8_0/Q6_K; Q4_K's and Q5_K's 6-bit scales and mins take a byte each
INTERLEAVED_BLOCK_BYTES: dict[int, int] = {2: 18, 3: 20, 6: 22, 8: 34, 12: 148, 13: 180, 14: 210}
INTERLEAVE_ROWS = 16
SCRATCH_FLOATS = 1 << 22   # dense path: dequantize at most 16 MB of fp32 weights at a time
DEQUANTIZE_TILE_FLOATS = 1 << 18   # bf16 dense path: 1 MB of fp32 rows, converted while in L2
# bf16 dense path: a chunk of up to 32 MB of bf16 weights per GEMM. Fewer, larger chunks: each switch between
# the C pool's dequantization and torch's GEMM threads cost time on 2 cores (a 1.5B model's gate/up at 512
# rows: 100 ms in 16 MB-fp32-sized chunks, 74 in 32 MB ones; 64 MB ones no faster)
BF16_CHUNK_ELEMENTS = 1 << 24
PANEL_ROWS = 8             # the library's default: calls of this many rows or more take its fp32 panel path


class UnsupportedQuantization(ValueError):
    """A tensor's quantization type has no kernel here, or its bytes do not match its type."""


def ggml_type_name(qtype: int) -> str:
    if qtype in QUANT_TYPES:
        return QUANT_TYPES[qtype][0]
    try:
        import gguf
        return gguf.GGMLQuantizationType(qtype).name
    except (ImportError, ValueError):
        return f"unknown GGML type id {qtype}"


def is_supported(qtype: int) -> bool:
    return qtype in QUANT_TYPES


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A 2-D GGUF weight as stored: `rows` rows of quantized blocks along its `cols` (input) axis."""
    qtype: int
    rows: int
    cols: int
    data: torch.Tensor          # uint8 [rows, bytes per row]
    name: str = ""
    interleaved: bool = False   # rows in groups of 16 (engine/kernels/csrc/qlinear_x16.c), not GGUF's row after row

    def __post_init__(self) -> None:
        label = f"tensor {self.name!r}: " if self.name else ""
        if self.qtype not in QUANT_TYPES:
            raise UnsupportedQuantization(
                f"{label}quantization type {ggml_type_name(self.qtype)} has no quantized kernel "
                f"(supported: {', '.join(n for n, _, _ in QUANT_TYPES.values())})")
        type_name, block, _ = QUANT_TYPES[self.qtype]
        if self.cols % block:
            raise UnsupportedQuantization(f"{label}{type_name} needs columns in blocks of {block}, got {self.cols}")
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != (self.rows, self.row_bytes):
            raise UnsupportedQuantization(
                f"{label}corrupt {type_name} data: expected uint8 [{self.rows}, {self.row_bytes}], "
                f"got {self.data.dtype} {list(self.data.shape)}")

    @property
    def type_name(self) -> str:
        return QUANT_TYPES[self.qtype][0]

    @property
    def row_bytes(self) -> int:
        _, block, size = QUANT_TYPES[self.qtype]
        return self.cols // block * (INTERLEAVED_BLOCK_BYTES[self.qtype] if self.interleaved else size)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def interleavable(self) -> bool:
        """The interleaved kernels (engine/kernels/csrc/qlinear_x16.c) have a layout for it (whole groups of 16 rows)."""
        return not self.interleaved and self.qtype in INTERLEAVED_BLOCK_BYTES and self.rows % INTERLEAVE_ROWS == 0

    def take_rows(self, index: torch.Tensor) -> QuantizedTensor:
        """Rows reordered (llama.cpp's q/k permutation undone): whole rows of blocks move."""
        if self.interleaved:
            raise ValueError(f"tensor {self.name!r}: rows of an interleaved tensor cannot be taken")
        return QuantizedTensor(self.qtype, self.rows, self.cols, self.data[index].contiguous(), self.name)

    @classmethod
    def from_numpy(cls, qtype: int, rows: int, cols: int, data, name: str = "", copy: bool = True) -> QuantizedTensor:
        """copy=False shares `data` (a writable uint8 array, e.g. engine.model.gguf_file.map_tensor's)."""
        import numpy as np
        array = np.array(data, dtype=np.uint8) if copy else data
        return cls(qtype, rows, cols, torch.from_numpy(array).reshape(rows, -1), name)


class QuantKernels:
    """The library's quantized ops: y = x @ W^T on quantized W, and dequantization of rows."""

    def __init__(self, library: CpuLibrary) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        library.lib.qlin_matmul.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, i64]
        library.lib.qlin_dequantize.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ptr, i64]
        library.lib.qlin_set_panel_rows.argtypes = [ctypes.c_int]
        library.lib.qlin_x16_matmul.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, i64, ctypes.c_int]
        library.lib.qlin_x16_dequantize.argtypes = [ctypes.c_int, ptr, i64, ptr, i64, i64, ptr, i64]
        library.lib.qlin_x16_repack.argtypes = [ctypes.c_int, ptr, i64, i64, ptr]
        library.lib.qlin_x16_row_bytes.argtypes = [ctypes.c_int, i64]
        library.lib.qlin_x16_row_bytes.restype = i64
        library.lib.qlin_set_panel_rows(PANEL_ROWS)
        self.library, self.lib = library, library.lib
        self._scratch = threading.local()

    @property
    def avx2(self) -> bool:
        return self.library.avx2

    @property
    def avx512(self) -> bool:
        return self.library.avx512

    @property
    def threads(self) -> int:
        return self.library.threads

    def park(self) -> None:
        self.library.park()

    def set_isa(self, isa: str) -> str:
        return self.library.set_isa(isa)

    def set_panel_rows(self, rows: int) -> None:
        """Steps of at least `rows` rows take the fp32 panel path, fewer the 16-bit dot products
        (PANEL_ROWS by default, where the two cross on the 2-core AVX2 EPYC; tests force either path)."""
        self.lib.qlin_set_panel_rows(rows)

    def matmul_into(self, w: QuantizedTensor, x: torch.Tensor, out: torch.Tensor, col0: int = 0,
                    int8: bool = False) -> None:
        """out[:, col0:col0 + w.rows] = x @ W^T; x: contiguous fp32 [n, w.cols], out: fp32 [n, *] rows contiguous.
        int8: x quantized to int8 per block of 32 where the kernel has it (interleaved 4- to 6-bit rows on
        AVX-512 VNNI), else to 16 bits."""
        assert x.dtype == torch.float32 and x.is_contiguous() and x.shape[1] == w.cols
        assert out.dtype == torch.float32 and out.stride(1) == 1 and out.shape[0] == x.shape[0]
        args = (w.qtype, w.data.data_ptr(), w.rows, w.cols, x.data_ptr(), x.shape[0], out.data_ptr() + 4 * col0,
                out.stride(0))
        rc = self.lib.qlin_x16_matmul(*args, int(int8)) if w.interleaved else self.lib.qlin_matmul(*args)
        self._check(rc, w)

    def dequantize_into(self, w: QuantizedTensor, out: torch.Tensor, ids: torch.Tensor | None = None,
                        row0: int = 0, rows: int | None = None) -> None:
        """out[i] = W[ids[i]] (ids None: W[row0 + i] for `rows` rows) in fp32; out rows contiguous."""
        assert out.dtype == torch.float32 and out.stride(1) == 1
        if w.interleaved:
            ids = None if ids is None else ids.to(torch.int64).contiguous()
            n = ids.numel() if ids is not None else w.rows - row0 if rows is None else rows
            self._check(self.lib.qlin_x16_dequantize(w.qtype, w.data.data_ptr(), w.cols, None if ids is None else
                                                     ids.data_ptr(), row0, n, out.data_ptr(), out.stride(0)), w)
            return
        if ids is not None:
            ids = ids.to(torch.int64).contiguous()
            n, base, ids_ptr = ids.numel(), w.data.data_ptr(), ids.data_ptr()
        else:
            n = w.rows - row0 if rows is None else rows
            base, ids_ptr = w.data.data_ptr() + row0 * w.row_bytes, None
        self._check(self.lib.qlin_dequantize(w.qtype, base, n, w.cols, ids_ptr, out.data_ptr(), out.stride(0)), w)

    def dequantize(self, w: QuantizedTensor) -> torch.Tensor:
        out = torch.empty(w.rows, w.cols)
        self.dequantize_into(w, out)
        return out

    def interleave(self, w: QuantizedTensor) -> QuantizedTensor:
        """w with its rows interleaved in groups of 16 for engine/kernels/csrc/qlinear_x16.c (GGUF's bits, moved)."""
        out = torch.empty(w.rows, w.cols // QUANT_TYPES[w.qtype][1] * INTERLEAVED_BLOCK_BYTES[w.qtype], dtype=torch.uint8)
        self._check(self.lib.qlin_x16_repack(w.qtype, w.data.data_ptr(), w.rows, w.cols, out.data_ptr()), w)
        return QuantizedTensor(w.qtype, w.rows, w.cols, out, w.name, interleaved=True)

    def scratch(self, elements: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A per-thread buffer of `dtype` reused across calls (a fresh 16 MB buffer would page-fault each step)."""
        name = f"buf_{dtype}"
        buf = getattr(self._scratch, name, None)
        if buf is None or buf.numel() < elements:
            with torch.inference_mode(False):   # a normal tensor: torch's in-place ops on it work in and out of inference mode
                buf = torch.empty(elements, dtype=dtype)
            setattr(self._scratch, name, buf)
        return buf[:elements]

    def drop_scratch(self) -> None:
        """Free every thread's scratch buffers (the next call that needs one allocates it again)."""
        self._scratch = threading.local()

    @staticmethod
    def _check(rc: int, w: QuantizedTensor) -> None:
        if rc == -1:
            raise UnsupportedQuantization(f"no kernel for {ggml_type_name(w.qtype)}")
        if rc == -2:
            raise UnsupportedQuantization(f"{w.type_name}: {w.cols} columns are not whole blocks")
        if rc == -4:
            raise UnsupportedQuantization(f"{w.type_name}: {w.rows} rows are not whole groups of {INTERLEAVE_ROWS}")
        if rc != 0:
            raise MemoryError(f"qlinear kernel failed ({rc})")


@functools.cache
def load_kernels() -> QuantKernels | None:
    """The kernels, or None (logged once) where they were not built or the CPU cannot run them fast."""
    library = load_library()
    if library is None:
        return None
    if not library.avx2:
        log.warning("this CPU lacks AVX2/FMA/F16C: quantized kernels would run scalar code; with weights=auto "
                    "GGUF weights are dequantized")
    return QuantKernels(library)


@dataclass
class QuantizedPath:
    """Shared by every quantized module of a model: steps of up to max_rows rows use the kernels, larger ones
    dequantize to `dense_dtype` and run torch's GEMM."""
    kernels: QuantKernels
    max_rows: int = 16
    measured: bool = False
    int8: bool = False     # int8 activations instead of 16-bit (EngineConfig.kernel_activations)
    dense_dtype: torch.dtype = field(default_factory=lambda: dense_gemm_dtype())


def dense_gemm_dtype() -> torch.dtype:
    """bf16 where the CPU has AMX tiles, whose bf16 GEMM (oneDNN, fp32 accumulation) ran a 512 x 1536 x 17920
    product 7.8x faster than fp32's on a 2-core Xeon; fp32 elsewhere (AVX-512 BF16 alone is no faster).
    DENSE_GEMM_DTYPE=fp32 keeps fp32 there too."""
    if os.environ.get("DENSE_GEMM_DTYPE") == "fp32":
        return torch.float32
    return torch.bfloat16 if torch.cpu._is_amx_tile_supported() else torch.float32


class QuantizedLinear(nn.Module):
    """y = x @ W^T + b with W given as row blocks (fused q/k/v or gate/up parts may differ in type)."""

    def __init__(self, parts: list[QuantizedTensor], bias: torch.Tensor | None, path: QuantizedPath,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        cols = {p.cols for p in parts}
        if len(cols) != 1:
            raise ValueError(f"parts of one linear layer have different input sizes: {sorted(cols)}")
        self.parts, self.path, self.dtype = parts, path, dtype
        self.in_features, self.out_features = cols.pop(), sum(p.rows for p in parts)
        self.bias = None if bias is None else bias.float()
        self.offsets = [sum(p.rows for p in parts[:i]) for i in range(len(parts))]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).float().contiguous()
        out = self.quantized(x2) if x2.shape[0] <= self.path.max_rows else self.dense(x2)
        if self.bias is not None:
            out += self.bias
        return out.to(self.dtype).reshape(*lead, self.out_features)

    def quantized(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.out_features)
        for part, col0 in zip(self.parts, self.offsets):
            self.path.kernels.matmul_into(part, x, out, col0, self.path.int8)
        return out

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantize a chunk of output rows (all of a layer's where they fit) into a reused buffer of the path's
        dense dtype, GEMM, next chunk. bf16 (AMX): fp32 accumulation, a bf16 result."""
        dtype = self.path.dense_dtype
        out = torch.empty(x.shape[0], self.out_features)
        x = x.to(dtype)
        step = max(1, (BF16_CHUNK_ELEMENTS if dtype == torch.bfloat16 else SCRATCH_FLOATS) // self.in_features)
        for r0 in range(0, self.out_features, step):
            r1 = min(r0 + step, self.out_features)
            w = self.path.kernels.scratch((r1 - r0) * self.in_features, dtype).view(r1 - r0, self.in_features)
            self._dequantize_into(r0, r1, w)
            self.path.kernels.park()
            if r1 - r0 == self.out_features and dtype == out.dtype:
                torch.matmul(x, w.t(), out=out)
            else:
                out[:, r0:r1] = x @ w.t()
        return out

    def _dequantize_into(self, r0: int, r1: int, w: torch.Tensor) -> None:
        """Rows r0..r1 into w: directly in fp32; for bf16 a tile of fp32 rows at a time (it stays in L2) and
        converted into w."""
        if w.dtype == torch.float32:
            self._dequantize_rows(r0, r1, w)
            return
        tile = max(1, DEQUANTIZE_TILE_FLOATS // self.in_features)
        for t0 in range(r0, r1, tile):
            t1 = min(t0 + tile, r1)
            rows = self.path.kernels.scratch((t1 - t0) * self.in_features).view(t1 - t0, self.in_features)
            self._dequantize_rows(t0, t1, rows)
            w[t0 - r0:t1 - r0].copy_(rows)

    def _dequantize_rows(self, r0: int, r1: int, w: torch.Tensor) -> None:
        """Rows r0..r1 of the concatenated parts into w."""
        for part, off in zip(self.parts, self.offsets):
            lo, hi = max(r0, off), min(r1, off + part.rows)
            if lo < hi:
                self.path.kernels.dequantize_into(part, w[lo - r0:hi - r0], row0=lo - off, rows=hi - lo)

    def extra_repr(self) -> str:
        types = "+".join(p.type_name for p in self.parts)
        return f"in_features={self.in_features}, out_features={self.out_features}, {types}"


class QuantizedEmbedding(nn.Module):
    """Token embeddings looked up from quantized rows (a tied LM head shares the same bytes)."""

    def __init__(self, weight: QuantizedTensor, path: QuantizedPath, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight_q, self.path, self.dtype = weight, path, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty(ids.numel(), self.weight_q.cols)
        self.path.kernels.dequantize_into(self.weight_q, out, ids=ids.reshape(-1).cpu())
        return out.to(self.dtype).reshape(*ids.shape, self.weight_q.cols)


@dataclass(frozen=True)
class Crossover:
    """Timings behind QuantizedPath.max_rows: per row count, quantized and dense seconds (dense: at least the
    time to dequantize the layer, where the kernel beat that; not measured further)."""
    max_rows: int
    quantized_s: dict[int, float]
    dense_s: dict[int, float]


CROSSOVER_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def measure_crossover(linear: QuantizedLinear, candidates: tuple[int, ...] = CROSSOVER_ROWS,
                      repeats: int = 3) -> Crossover:
    """The largest row count up to which the quantized kernel beats dequantize + GEMM on `linear`
    (best of `repeats`, so a busy core shows less); stops at the first count where dense wins. On the
    GGUF layout the fp32 GEMM wins from a few dozen rows on; on interleaved rows with VNNI the 16-bit
    products ran at twice its speed at every count measured (Zen 4), hence counts up to 2048."""
    quantized_s: dict[int, float] = {}
    dense_s: dict[int, float] = {}
    best = 0
    dequantize_s = best_time(lambda: linear.dense(torch.randn(1, linear.in_features)), repeats)
    for n in candidates:
        x = torch.randn(n, linear.in_features)
        quantized_s[n] = best_time(lambda: linear.quantized(x), repeats)
        # the dense path dequantizes the whole layer whatever n: a kernel faster than that wins unmeasured
        # (dense_s then holds that floor), which spares seconds per count on a 1.5B model's layers
        dense_s[n] = dequantize_s if quantized_s[n] < dequantize_s else best_time(lambda: linear.dense(x), repeats)
        if quantized_s[n] > dense_s[n]:
            break
        best = n
    return Crossover(best, quantized_s, dense_s)


def best_time(fn, repeats: int, enough_s: float = 0.25) -> float:
    """Fastest of up to `repeats` timed calls after an untimed one (a busy core shows less in the best); calls
    that take longer than `enough_s` are timed once (a 1.5B model's layers at 2048 rows: seconds each)."""
    t0 = time.perf_counter()
    fn()
    if time.perf_counter() - t0 > enough_s:
        repeats = 1
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
