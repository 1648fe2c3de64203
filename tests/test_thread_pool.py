"""The C kernels' thread pool under a worker that starts its jobs late (as a descheduled one does on a
2-core machine): every chunk of every job runs exactly once. Built here from engine/csrc/thread_pool.c
with a delay compiled in (POOL_TEST_DELAY), which the daemon's build leaves out."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CC = shutil.which("cc") or shutil.which("gcc")


def build_pool(tmp_path: Path, delay: int) -> ctypes.CDLL:
    out = tmp_path / f"pool_stress_{delay}.so"
    subprocess.run([CC, "-O2", "-shared", "-fPIC", f"-DPOOL_TEST_DELAY={delay}", f"-I{ROOT / 'engine/csrc'}",
                    str(ROOT / "engine/csrc/thread_pool.c"), str(ROOT / "tests/csrc/pool_stress.c"),
                    "-o", str(out), "-lpthread"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.pool_stress.restype = ctypes.c_int64
    lib.pool_stress.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("delay", [0, 20000])
def test_every_chunk_runs_once_when_a_worker_starts_late(tmp_path, delay):
    """A worker that saw a new job late used to read the next job's chunk count as its own and claim
    a chunk past the end of an ended job (run twice, or on dead arguments: the daemon crashed)."""
    lib = build_pool(tmp_path, delay)
    assert lib.pool_stress(20000, 2, 40) == 0
