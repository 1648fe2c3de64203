"""One HTTP request through an ASGI app in this process, its response as a stream of parts.

A replica runs the daemon's own FastAPI app (validation, errors, SSE) and the ingress hands it
requests over Ray instead of a socket: the response comes back as its head first, then its body
chunks as the app sends them, so streaming stays streaming. Closing the stream early tells the
app the client disconnected, which aborts the request in the engine and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HttpCall:
    method: str
    path: str
    query: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: list[tuple[str, str]]


async def call_app(app: Any, call: HttpCall) -> AsyncIterator[ResponseHead | bytes]:
    """The app's response to `call`: a ResponseHead, then the body's chunks."""
    messages: asyncio.Queue[dict | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    request_sent = False

    async def receive() -> dict:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": call.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(_scope(call), receive, messages.put)
        finally:
            messages.put_nowait(None)

    task = asyncio.create_task(run())
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseHead(message["status"], [(k.decode("latin-1"), v.decode("latin-1"))
                                                       for k, v in message.get("headers", [])])
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body", False):
                    break
    finally:
        disconnected.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)


def _scope(call: HttpCall) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": call.method.upper(), "scheme": "http", "path": call.path, "raw_path": call.path.encode(),
            "query_string": call.query.encode(), "root_path": "", "client": ("ingress", 0),
            "server": ("replica", 80),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in call.headers]}
