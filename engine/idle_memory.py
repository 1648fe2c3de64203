"""The C heap's free pages, given back to the system: after the checkpoint is loaded, and by an idle engine
(with the quantized kernels' scratch buffers, LLMEngine.release_idle_memory).

A prompt step of a few hundred rows takes activations and dequantized weights that glibc keeps in its
arenas once freed, for the process's life: tens of MB on a 1.5B model after one 512-token prompt, all of
it free memory that malloc_trim returns (benchmarks/resident_memory.py, docs/llama_cpp.md "Resident
memory"). The engine loop gives it back once it has been idle a while (serving/engine_loop.py); the next
step pays the page faults again, a few ms against a prompt step of a second or more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None   # musl and macOS have none


def return_free_heap() -> bool:
    """glibc's malloc_trim(0): every arena's free pages back to the system. False: nothing was returned,
    or there is no glibc."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
