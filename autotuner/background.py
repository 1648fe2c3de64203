"""The tuner's own compute (simulations, fits) out of the serving process: a child Python process
at the lowest CPU priority, on one core, within a share of that core (it sleeps after each unit of
work), so that it never takes CPU time from the engine's steps. Measured on the real daemon: ~100 s
of warm-start simulations in a thread of the serving process raised P99 TBT from 0.23 s to 2.86 s.

The child is a fresh interpreter (`python -P -m autotuner.background`), not a fork of the daemon (its
torch threads make forking unsafe) and not multiprocessing's "spawn", which re-imports the parent's
main module in the child. It lowers its own priority before importing anything else. Only plain data
(dataclasses, dicts, lists) crosses, pickled over its stdin and stdout. A child that raises,
crashes, is killed or runs past its timeout gives the caller's fallback, an ERROR with the cause and
a call of the runner's `on_failure` (the tuner counts it on /metrics and in `tuner status`).

The child runs with `-P` and a PYTHONPATH of the project's root and the daemon's own path without
its working directory: `python -m` would put the working directory first on sys.path, and a user
directory holding a `loadgen.py` (or engine.py, policies.py, ...) then shadowed our package and
killed every warm start."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
LOWEST_PRIORITY = 19
PROJECT_ROOT = Path(__file__).resolve().parent.parent     # holds autotuner/, engine/, ...
POLL_S = 0.5                   # how often the waiting thread looks at the stop event

_cpu_share = 1.0               # set in a background child only; 1 elsewhere (throttle() does nothing)
_cpu_seen = 0.0                # the process's CPU time at the end of the last throttle()


def throttle() -> None:
    """Call between units of work (e.g. one simulated trial). In a background child, sleep long
    enough that the process's CPU time since the last call is at most its share of the time that
    passed; in any other process it returns at once, so in-process callers stay deterministic."""
    global _cpu_seen
    if _cpu_share >= 1.0:
        return
    used = time.process_time() - _cpu_seen
    time.sleep(max(0.0, used * (1.0 / _cpu_share - 1.0)))
    _cpu_seen = time.process_time()


def lower_priority() -> None:
    """The lowest CPU priority, and one core (the last one allowed) when more than one is. On Linux
    both hold for the calling thread and the threads it starts later: call it before any import
    that starts threads (numpy's BLAS, torch)."""
    os.setpriority(os.PRIO_PROCESS, 0, LOWEST_PRIORITY)
    if hasattr(os, "sched_getaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[-1]})


class BackgroundRunner:
    """Runs `fn(arg)` in a low-priority child process and waits for its result (on the caller's
    thread, the tuner's: serving goes on meanwhile)."""

    def __init__(self, cpu_share: float = 0.5, timeout_s: float = 600.0,
                 stop: threading.Event | None = None, on_failure: Callable[[str], None] | None = None) -> None:
        """`on_failure(cause)`: called after each failed run, before the fallback is returned."""
        if not 0 < cpu_share <= 1:
            raise ValueError(f"cpu_share must be in (0, 1], not {cpu_share}")
        self.cpu_share, self.timeout_s, self.stop, self.on_failure = cpu_share, timeout_s, stop, on_failure
        self.last_failure: str | None = None      # the cause of the latest failed run

    def run(self, fn: Callable[[T], R], arg: T, fallback: R) -> R:
        """`fn` must be a module-level function; `fallback` is returned (with an ERROR logged) when
        the child fails or times out. Raises InterruptedError when `stop` is set meanwhile."""
        name = getattr(fn, "__qualname__", str(fn))
        start = time.monotonic()
        try:
            payload = pickle.dumps((fn, arg, self.cpu_share))
        except Exception as e:
            return self._failed(name, f"its input does not pickle: {e!r}", fallback)
        # stderr is the daemon's: the child's logs and tracebacks land in the daemon's log
        proc = subprocess.Popen(child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=os.environ | {"PYTHONPATH": child_path()})
        try:
            out = self._wait(proc, payload, start)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if out is None:
            return self._failed(name, f"ran past its {self.timeout_s:.0f} s timeout; stopped it", fallback)
        try:
            status, value = pickle.loads(out)
        except Exception:
            return self._failed(name, f"the child process died (exit code {proc.returncode})", fallback)
        if status != "ok":
            return self._failed(name, value.strip().splitlines()[-1], fallback, detail=value)
        log.info("tuner: background %s took %.1f s", name, time.monotonic() - start)
        return value

    def _failed(self, name: str, cause: str, fallback: R, detail: str = "") -> R:
        self.last_failure = f"{name}: {cause}"
        log.error("tuner: background %s failed: %s%s", name, cause, "\n" + detail if detail else "")
        if self.on_failure is not None:
            self.on_failure(self.last_failure)
        return fallback

    def _wait(self, proc: subprocess.Popen, payload: bytes, start: float) -> bytes | None:
        """The child's stdout once it exits; None past the timeout."""
        data: bytes | None = payload
        while True:
            try:
                return proc.communicate(data, timeout=POLL_S)[0]
            except subprocess.TimeoutExpired:
                data = None                    # sent once; communicate() keeps what it read so far
            if self.stop is not None and self.stop.is_set():
                raise InterruptedError("tuner stopping")
            if time.monotonic() - start > self.timeout_s:
                return None


def child_command() -> list[str]:
    """This interpreter, `-P`: the child's working directory is not put on sys.path."""
    return [sys.executable, "-P", "-m", "autotuner.background"]


def child_path() -> str:
    """The project's root first, then the daemon's sys.path without its working directory."""
    cwd = os.getcwd()
    rest = [p for p in sys.path if p and os.path.abspath(p) != cwd and Path(p).resolve() != PROJECT_ROOT]
    return os.pathsep.join([str(PROJECT_ROOT), *rest])


def _main() -> None:
    """The child: read (fn, arg, cpu_share) from stdin, write ("ok", result) or ("error", traceback)."""
    global _cpu_share
    lower_priority()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    result = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # stray prints go to stderr, not into the result
    try:
        fn, arg, _cpu_share = pickle.load(sys.stdin.buffer)
        reply: tuple[str, Any] = ("ok", fn(arg))
    except BaseException:
        reply = ("error", traceback.format_exc())
    pickle.dump(reply, result)
    result.close()


def _exit_with_parent(parent: int) -> None:
    """A daemon killed outright (SIGKILL, OOM) cannot stop its child: the child stops itself."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


if __name__ == "__main__":
    from autotuner.background import _main as main   # this module under its own name, whose throttle() `fn` calls
    main()
