"""The engine loop's death, injected: /health turns 503 with the reason, every open stream ends with an
error chunk, a waiting non-streaming request gets a 500, new requests a 503, and the daemon exits 3
within a few seconds (so systemd's Restart=on-failure or Kubernetes restarts it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.llm_engine import LLMEngine
from serving.api_server import ApiConfig
from serving.engine_loop import EngineLoop
from tests.conftest import make_engine
from tests.live_server import LiveServer, free_port, wait_healthy

MODEL = "tiny"
ROOT = Path(__file__).resolve().parent.parent


def stream_lines(url: str, lines: list[str], max_tokens: int = 400) -> None:
    body = {"prompt": "w5 w6", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            lines.extend(line for line in r.iter_lines() if line)
    except httpx.TransportError as e:        # the server went away without ending the stream: a failure below
        lines.append(f"transport error: {e}")


def start_streams(url: str, count: int) -> tuple[list[threading.Thread], list[list[str]]]:
    """`count` streaming clients, returned once each has its first token."""
    outputs: list[list[str]] = [[] for _ in range(count)]
    threads = [threading.Thread(target=stream_lines, args=(url, out), daemon=True) for out in outputs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not all(any(line.startswith('data: {"id"') for line in out) for out in outputs):
        assert time.monotonic() < deadline and all(t.is_alive() for t in threads), outputs
        time.sleep(0.01)
    return threads, outputs


def assert_ended_with_an_error(lines: list[str]) -> None:
    errors = [json.loads(line[6:]) for line in lines if line.startswith('data: {"error"')]
    assert errors and errors[0]["error"]["type"] == "server_error", lines[-3:]
    assert lines[-1] == "data: [DONE]", lines[-3:]


def slow_steps(monkeypatch) -> None:
    """Steps of >= 10 ms, so a 400-token stream is still open when the fault comes."""
    original = LLMEngine.step
    monkeypatch.setattr(LLMEngine, "step", lambda self, *a, **k: time.sleep(0.01) or original(self, *a, **k))


def live_server(tiny_hf, monkeypatch, stall_s: float | None = None) -> LiveServer:
    slow_steps(monkeypatch)
    api = ApiConfig(served_model_name=MODEL, engine_stall_s=stall_s)
    return LiveServer(lambda: make_engine(tiny_hf[0], num_kv_blocks=256, token_budget=64), api)


@pytest.fixture()
def server(tiny_hf, monkeypatch):
    with live_server(tiny_hf, monkeypatch) as s:
        yield s


def fail_containment(monkeypatch, engine: LLMEngine) -> None:
    """A step raises and so does the abort that would contain it (a corrupted engine)."""
    def broken(*args, **kwargs):
        raise RuntimeError("injected: the block manager is corrupt")
    monkeypatch.setattr(engine, "step", broken)
    monkeypatch.setattr(engine, "abort", broken)


def assert_failed(server, reason: str) -> None:
    deadline = time.monotonic() + 15
    while server.state.engine_failure is None:
        assert time.monotonic() < deadline, "the engine's death went unnoticed"
        time.sleep(0.05)
    health = httpx.get(server.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "failed", health.text
    assert reason in health.json()["error"]
    refused = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 2})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_failed"
    assert reason in refused.json()["error"]["message"]


def test_an_exception_the_loop_cannot_contain_fails_health_and_ends_every_stream(server, monkeypatch):
    threads, outputs = start_streams(server.url, 2)
    waiting: list[httpx.Response] = []
    plain = threading.Thread(target=lambda: waiting.append(httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, "prompt": "w7", "max_tokens": 400, "ignore_eos": True},
        timeout=60)), daemon=True)
    plain.start()
    deadline = time.monotonic() + 30
    while server.state.loop.num_unfinished < 3:           # the plain request in the engine too
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fail_containment(monkeypatch, server.engine)
    assert_failed(server, "RuntimeError: injected: the block manager is corrupt")
    for t in threads + [plain]:
        t.join(30)
    for lines in outputs:
        assert_ended_with_an_error(lines)
    assert waiting[0].status_code == 500 and waiting[0].json()["error"]["type"] == "server_error"
    assert not server.state.loop.alive


def test_a_contained_failure_repeated_three_times_running_is_the_loops_death(tiny_hf):
    """One failing iteration fails its requests and the loop goes on; three in a row with nothing good
    between mean a broken engine."""
    loop = EngineLoop(make_engine(tiny_hf[0]), max_waiting=8)
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected")
    loop._drain = broken
    loop.start()
    deadline = time.monotonic() + 5
    while loop.failure is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert loop.failure == "RuntimeError: injected" and len(calls) == 3


def test_the_loop_thread_gone_is_noticed(server, monkeypatch):
    threads, outputs = start_streams(server.url, 1)
    # the loop returns without a word, as a thread killed under it would end
    monkeypatch.setattr(server.state.loop, "_stopping", _AlwaysSet())
    assert_failed(server, "the engine loop thread is gone")
    threads[0].join(30)
    assert_ended_with_an_error(outputs[0])


def test_a_step_stuck_past_engine_stall_s_is_the_loops_death(tiny_hf, monkeypatch):
    release = threading.Event()
    with live_server(tiny_hf, monkeypatch, stall_s=1.0) as server:
        threads, outputs = start_streams(server.url, 1)
        monkeypatch.setattr(server.engine, "step", lambda *a, **k: release.wait(30) and [])   # a deadlocked kernel
        try:
            assert_failed(server, "has not finished a step in 1 s")
            threads[0].join(30)
            assert_ended_with_an_error(outputs[0])
        finally:
            release.set()


class _AlwaysSet:
    """An Event the loop reads as set (it returns) while the watchdog still sees it clear."""

    def is_set(self) -> bool:
        return True

    def set(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> bool:
        time.sleep(timeout or 0)
        return False


INJECT = """
import os, sys, time
from engine.llm_engine import LLMEngine
trigger = sys.argv[1]
step, abort = LLMEngine.step, LLMEngine.abort
def fault(name):
    raise RuntimeError(f"injected fault in {name}")
def slow_step(self, *a, **k):
    time.sleep(0.01)
    return fault("a step") if os.path.exists(trigger) else step(self, *a, **k)
LLMEngine.step = slow_step
LLMEngine.abort = lambda self, *a, **k: fault("the containment") if os.path.exists(trigger) else abort(self, *a, **k)
from serving.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_the_daemon_exits_non_zero_within_seconds_of_the_engines_death(tiny_hf, tmp_path):
    """The process a supervisor runs: the fault (a step failing, then its containment) is injected by a
    wrapper around the real entry point; the daemon ends the open stream with an error chunk and exits 3
    within a few seconds, saying why on its last line."""
    trigger, port = tmp_path / "fault", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-c", INJECT, str(trigger), "serve", "--model", tiny_hf[0], "--dtype",
                             "fp32", "--port", str(port), "--state-dir", str(tmp_path), "--no-calibrate", "--no-tune"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_healthy(proc, url)
        threads, outputs = start_streams(url, 1)
        trigger.touch()
        faulted = time.monotonic()
        threads[0].join(30)
        assert_ended_with_an_error(outputs[0])
        assert proc.wait(15) == 3
        assert time.monotonic() - faulted < 8
        last = proc.stderr.read().strip().splitlines()[-1]
        assert last == "autotuned-serve: error: the engine failed: RuntimeError: injected fault in the containment"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
