"""The C library of CPU kernels: linear layers on GGUF's quantized weights (engine/kernels/csrc/qlinear.c,
qlinear_x16.c), paged decode attention (engine/kernels/csrc/paged_attention.c), a prefill chunk's causal
attention (prefill_attention.c), a decode step's rotary
embedding and KV-cache write (rope_store.c) and RMSNorm after the residual add (rms_norm.c), sharing
one thread pool (thread_pool.c).

Built by the install step into engine/kernels/_cpu_kernels*.so and loaded with ctypes: no Python API, so
nothing about torch at build time, and ctypes drops the GIL during a call. Optional: where it was
not built or does not load, `load_library` says so once in the log and returns None, and callers
fall back to torch (dequantized weights, gather-then-SDPA attention).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.machinery
import importlib.util
import logging
import os
from dataclasses import dataclass, replace

import torch

log = logging.getLogger(__name__)

NAME = "_cpu_kernels"
# another build of the library to load instead of the installed one: the sanitizer stage of .ci/run
# builds one with -fsanitize=address,undefined into build/sanitize/ and points this at it
LIBRARY_ENV = "AUTOTUNED_SERVE_CPU_KERNELS"


ISAS = ("scalar", "avx2", "avx512")   # the library's levels of code (isa.h), each adding to the one before


@dataclass(frozen=True)
class CpuLibrary:
    lib: ctypes.CDLL
    path: str
    threads: int        # the pool's size, the caller included
    isa: str            # the code in use at load: the best this CPU runs ("avx2": AVX2/FMA/F16C, "avx512": also
                        # F, BW, VNNI; else "scalar"), or lower where QLINEAR_ISA caps it

    @property
    def avx2(self) -> bool:
        """The kernels run their AVX2 code or better (else they are portable scalar C)."""
        return self.isa != "scalar"

    @property
    def avx512(self) -> bool:
        """The kernels run their AVX-512 VNNI code."""
        return self.isa == "avx512"

    def park(self) -> None:
        """Put the pool's spinning threads to sleep: torch's own threads need the cores next."""
        self.lib.qlin_park()

    def add_rms_norm(self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """RMSNorm(h) * weight, after h += delta in place where delta is given (engine/kernels/csrc/rms_norm.c);
        fp32, contiguous rows."""
        d = h.shape[-1]
        assert h.dtype == weight.dtype == torch.float32 and h.is_contiguous() and weight.shape == (d,)
        assert delta is None or (delta.dtype == torch.float32 and delta.is_contiguous() and delta.shape == h.shape)
        out = torch.empty_like(h)
        self.lib.add_rms_norm(h.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
                              out.data_ptr(), h.numel() // d, d, eps)
        return out

    def rope_store(self, qkv: torch.Tensor, heads, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """The rotated queries [T, H, D] of a fused projection's output qkv [T, (H + 2 KVH) * D], with its
        rotated keys and its values written to their cache slots (engine/kernels/csrc/rope_store.c); fp32 qkv,
        fp32 or fp16 caches. heads: an engine.attention.backends.HeadShape; cos/sin: RotaryEmbedding.lookup's."""
        tokens, dim = qkv.shape[0], heads.head_dim
        assert qkv.dtype == cos.dtype == sin.dtype == torch.float32 and qkv.stride(1) == 1
        assert cos.is_contiguous() and sin.is_contiguous() and cos.numel() == sin.numel() == tokens * dim
        assert slots.dtype == torch.int64 and slots.is_contiguous() and slots.numel() == tokens
        assert k_cache.dtype == v_cache.dtype and k_cache.dtype in (torch.float32, torch.float16)
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[1:] == (heads.num_kv_heads, dim)
        q = torch.empty(tokens, heads.num_heads, dim)
        rc = self.lib.rope_store(qkv.data_ptr(), qkv.stride(0), tokens, heads.num_heads, heads.num_kv_heads, dim,
                                 cos.data_ptr(), sin.data_ptr(), q.data_ptr(), slots.data_ptr(), k_cache.data_ptr(),
                                 v_cache.data_ptr(), int(k_cache.dtype == torch.float16))
        if rc != 0:
            raise ValueError(f"rope_store: head_dim {dim} odd or heads too wide")
        return q

    def prefill_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, q_pos0: int, k_pos0: int,
                          window: int | None, scale: float) -> torch.Tensor | None:
        """Causal attention of q [n, H, D] over keys/values [KVH, L, D] (any strides along L and KVH, D
        contiguous), query i at position q_pos0 + i, key j at k_pos0 + j, each query seeing the keys at
        or before it (the last `window` of them where window is set): engine/kernels/csrc/prefill_attention.c.
        None where the kernel does not take the shape (the caller runs torch's SDPA)."""
        n, heads, dim = q.shape
        assert q.dtype == keys.dtype == values.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == dim
        assert keys.stride(2) == 1 and values.stride(2) == 1 and keys.shape == values.shape
        out = torch.empty(n, heads, dim)
        rc = self.lib.prefill_attention(q.data_ptr(), q.stride(0), keys.data_ptr(), keys.stride(0), keys.stride(1),
                                        values.data_ptr(), values.stride(0), values.stride(1), out.data_ptr(),
                                        heads * dim, n, keys.shape[1], heads, keys.shape[0], dim, q_pos0, k_pos0,
                                        window or 0, scale)
        return out if rc == 0 else None

    def set_isa(self, isa: str) -> str:
        """Run the kernels of level `isa` (one of ISAS, or "best"), or the best this CPU has below it, for
        tests; returns the level now in use."""
        return ISAS[self.lib.qlin_set_isa(len(ISAS) - 1 if isa == "best" else ISAS.index(isa))]


def library_path() -> str | None:
    """$AUTOTUNED_SERVE_CPU_KERNELS where set, else engine/kernels/_cpu_kernels<suffix>.so next to this file
    (build_ext --inplace, editable installs), or wherever the import system would find it (it is
    located, never imported: it has no Python API)."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        if not os.path.isfile(override):
            raise FileNotFoundError(f"{LIBRARY_ENV}={override}: no such file")
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = glob.glob(os.path.join(here, NAME + suffix))
        if found:
            return found[0]
    spec = importlib.util.find_spec(f"engine.{NAME}")
    return spec.origin if spec is not None and spec.origin else None


def isa_cap() -> str:
    """QLINEAR_ISA: the highest level of code the kernels may run ("best" by default; e.g. "avx2" on an
    AVX-512 CPU to run what an AVX2-only one would, as llama.cpp built with GGML_NATIVE=OFF does)."""
    isa = os.environ.get("QLINEAR_ISA", "best")
    if isa != "best" and isa not in ISAS:
        raise ValueError(f"QLINEAR_ISA={isa!r}: expected one of best, {', '.join(ISAS)}")
    return isa


@functools.cache
def load_library() -> CpuLibrary | None:
    """The library with its thread pool started (QLINEAR_THREADS threads, default torch's count) and its
    code chosen (`isa_cap`), or None, logged once, where it was not built or did not load."""
    path = library_path()
    if path is None:
        log.warning("CPU kernels not built (no engine/%s*.so; reinstall with pip install -e .): GGUF weights "
                    "are dequantized and decode attention gathers the KV cache for SDPA", NAME)
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.qlin_set_isa.argtypes = [ctypes.c_int]
        lib.add_rms_norm.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_float]
        lib.rope_store.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 6 + [ctypes.c_int]
        lib.prefill_attention.argtypes = ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] * 2
                                          + [ctypes.c_void_p] + [ctypes.c_int64] * 9 + [ctypes.c_float])
        threads = int(os.environ.get("QLINEAR_THREADS", "0")) or torch.get_num_threads()
        library = CpuLibrary(lib, path, lib.qlin_init_threads(threads), ISAS[lib.qlin_cpu_isa()])
        return replace(library, isa=library.set_isa(isa_cap()))
    except (OSError, AttributeError) as e:
        if os.environ.get(LIBRARY_ENV):
            raise     # a build asked for by name (the sanitized one) must not be replaced by the fallback
        log.warning("CPU kernels in %s did not load (%s): GGUF weights are dequantized and decode attention "
                    "gathers the KV cache for SDPA", path, e)
        return None


def fast_library() -> CpuLibrary | None:
    """The library where its AVX2 code runs (what `auto` settings choose it on); None elsewhere."""
    library = load_library()
    return library if library is not None and library.avx2 else None
