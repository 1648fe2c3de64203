"""Waiting for a server a benchmark started to load its model: the one /health loop the scripts share.
Light on imports (httpx only), so scripts that keep torch out of their own process can use it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, name: str, log_path: str) -> bool:
    """Polls `url` (the server's /health; both servers answer 503 while loading) once a second until it
    answers 200: True; False once `timeout_s` has passed (the caller stops the server). RuntimeError
    if `proc` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} during start-up; see {log_path}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    return False


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
        return True
    except httpx.HTTPError:
        return False


@contextmanager
def running(cmd: list[str], health_url: str, log_path: str | Path, name: str, timeout_s: float = 600,
            cwd: str | Path | None = None, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """A server started from `cmd` (its output to `log_path`, no stdin, `env` if given), once its /health
    says 200; stopped on exit."""
    if _answers(health_url):    # another server on the port would be measured in this one's place
        raise RuntimeError(f"{health_url} already answers before {name} starts: the port is taken")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env)
    try:
        if not wait_healthy(proc, health_url, timeout_s, name, str(log_path)):
            raise RuntimeError(f"{name} did not start within {timeout_s:.0f} s; see {log_path}")
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)
