"""The C kernels' thread pool under a worker that starts its jobs late (as a descheduled one does on a
2-core machine): every chunk of every job runs exactly once, and ThreadSanitizer sees no data race in
it. Built here from engine/kernels/csrc/thread_pool.c with a delay compiled in (POOL_TEST_DELAY), which the
daemon's build leaves out."""

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
    subprocess.run([CC, "-O2", "-shared", "-fPIC", f"-DPOOL_TEST_DELAY={delay}", f"-I{ROOT / 'engine/kernels/csrc'}",
                    str(ROOT / "engine/kernels/csrc/thread_pool.c"), str(ROOT / "tests/csrc/pool_stress.c"),
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


def build_tsan(tmp_path: Path, name: str, sources: list[str], flags: tuple[str, ...] = ()) -> Path | None:
    """A ThreadSanitizer program, or None where this compiler or kernel cannot build or run one."""
    out = tmp_path / name
    built = subprocess.run([CC, "-O1", "-g", "-fsanitize=thread", *flags, f"-I{ROOT / 'engine/kernels/csrc'}", *sources,
                            "-o", str(out), "-lpthread"], capture_output=True, text=True)
    return out if built.returncode == 0 else None


@pytest.mark.skipif(CC is None, reason="no C compiler")
@pytest.mark.parametrize("delay", [0, 2000])
def test_the_pool_has_no_data_race_under_thread_sanitizer(tmp_path, delay):
    """The stress harness built with -fsanitize=thread: a race on the pool's job slots (fn, arg, the
    claim word) would be reported even in runs where every chunk happened to run once."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    tsan_ok = build_tsan(tmp_path, "probe", [str(probe)])
    if tsan_ok is None or subprocess.run([str(tsan_ok)], capture_output=True).returncode != 0:
        pytest.skip("this compiler or kernel cannot build and run a ThreadSanitizer program")
    program = build_tsan(tmp_path, f"pool_stress_{delay}", [str(ROOT / "engine/kernels/csrc/thread_pool.c"),
                         str(ROOT / "tests/csrc/pool_stress.c"), str(ROOT / "tests/csrc/pool_stress_main.c")],
                         (f"-DPOOL_TEST_DELAY={delay}",))
    assert program is not None
    run = subprocess.run([str(program), "3000"], capture_output=True, text=True, timeout=120,
                         env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66"})
    assert "ThreadSanitizer" not in run.stderr, run.stderr
    assert run.returncode == 0 and run.stdout.startswith("0 units"), run.stdout + run.stderr
