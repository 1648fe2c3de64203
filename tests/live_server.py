"""A real uvicorn server on a free loopback port, in a thread, for API tests."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn

from serving.api_server import ApiConfig, ServerState
from serving.http_server import make_app
from engine.llm_engine import LLMEngine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 60) -> None:
    """Until a daemon started as `proc` answers /health with 200; fails with its output if it exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, str(proc.communicate()) if proc.poll() else ""
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)


def stream_completion(url: str, chunks: list[dict], api_key: str | None = None) -> None:
    """A 300-token streamed completion of the tiny model, its chunks appended as they come."""
    body = {"prompt": "w5 w6", "max_tokens": 300, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        chunks.extend(json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {"))


class LiveServer:
    def __init__(self, load_engine: Callable[[], LLMEngine], api: ApiConfig, extra_routes=None) -> None:
        self.state = ServerState(api, load_engine)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = make_app(self.state, grace_s=5, extra_routes=extra_routes)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become healthy")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def engine(self) -> LLMEngine:
        return self.state.loop.engine
