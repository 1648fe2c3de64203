"""The engine on one background thread, so request handlers only enqueue and stream.

Handlers make (tokenize + validate) a request on their own thread, submit it with a sink that
receives every RequestOutput, and may abort it. The loop thread alone touches engine state: it
drains submissions and aborts between steps, steps while there is work, and sleeps on the inbox
when idle.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.request import Request

log = logging.getLogger(__name__)

Sink = Callable[[RequestOutput], None]


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the client should retry later."""


class EngineLoop:
    def __init__(self, engine: LLMEngine, max_waiting: int = 256) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._pending = 0                 # submitted, not yet moved into the engine
        self._pending_tokens = 0          # ... and their prompt tokens
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None, None))
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + self._pending

    @property
    def num_unfinished(self) -> int:
        return len(self._sinks) + self._pending

    def token_load(self) -> tuple[int, int]:
        """(queued, running) tokens of work left: for each waiting (or just submitted) and each
        running request, its prompt tokens not yet computed plus the output tokens it may still
        generate (max_tokens). Read from another thread without stopping the loop: tuple() of a
        deque or list is one step under the GIL, and a count a step behind is good enough for a router."""
        scheduler = self.engine.scheduler
        waiting, running = tuple(scheduler.waiting), tuple(scheduler.running)
        return sum(map(_work_left, waiting)) + self._pending_tokens, sum(map(_work_left, running))

    def submit(self, request: Request, sink: Sink) -> None:
        with self._lock:
            if self.num_waiting >= self.max_waiting:
                raise QueueFullError(f"the waiting queue is full ({self.max_waiting} requests); retry later")
            self._pending += 1
            self._pending_tokens += _work_left(request)
        self._inbox.put(("add", request, sink))

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id, None))

    def abort_all(self) -> None:
        self._inbox.put(("abort_all", None, None))

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._drain(block=not self.engine.has_unfinished())
                if self.engine.has_unfinished():
                    self._deliver(self.engine.step())
            except Exception:  # a bug outside any one request: fail what is in flight, keep serving
                log.exception("engine step failed outside a request; aborting in-flight requests")
                for request_id in list(self._sinks):
                    self._abort(request_id)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            while True:
                self._handle(*item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, kind: str, payload, sink: Sink | None) -> None:
        if kind == "add":
            with self._lock:
                self._pending -= 1
                self._pending_tokens -= _work_left(payload)
            self._sinks[payload.request_id] = sink
            try:
                self.engine.enqueue(payload)
            except Exception:  # a duplicate id: fail that client only
                log.exception("could not queue request %s", payload.request_id)
                self._sinks.pop(payload.request_id)
                sink(RequestOutput(payload.request_id, [], "", "", [], payload.num_prompt_tokens, True, "error"))
        elif kind == "abort":
            self._abort(payload)
        elif kind == "abort_all":
            for request_id in list(self._sinks):
                self._abort(request_id)

    def _abort(self, request_id: str) -> None:
        request = self.engine.requests.get(request_id)
        if request is None or not self.engine.abort(request_id):
            return
        sink = self._sinks.pop(request_id, None)
        if sink:
            sink(RequestOutput(request_id, [], "", "", list(request.output_token_ids), request.num_prompt_tokens,
                               True, "abort"))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
            if sink is None:
                continue
            try:
                sink(out)
            except Exception:  # a broken consumer must not stop the loop
                log.exception("delivering output of %s failed", out.request_id)


def _work_left(request: Request) -> int:
    prefill = max(0, request.num_prompt_tokens - request.num_computed_tokens)
    return prefill + max(0, request.max_tokens - len(request.output_token_ids))
