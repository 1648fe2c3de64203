"""The engine on one background thread, so request handlers only enqueue and stream.

Handlers make (tokenize + validate) a request on their own thread, submit it with a sink that
receives every RequestOutput, and may abort it. The loop thread alone touches engine state: it
drains submissions and aborts between steps, steps while there is work, and sleeps on the inbox
when idle; a whole idle wait gives back the memory the steps left (LLMEngine.release_idle_memory).

A failure the loop can contain (a step that raised outside any one request) fails the requests in
flight and the loop goes on. One it cannot (an exception escaping that containment, the same
failure MAX_FAILURES_IN_A_ROW times running, the thread gone, or a step stuck past `stall_s`) is
the loop's death: `failure` says why, every open request ends with an error output, submissions
are refused, and the server (serving/http_server.py) exits non-zero so a supervisor restarts it.
A watchdog thread notices the deaths the loop cannot report itself (gone, stuck).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from engine.errors import EngineFailed
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.scheduling.admission import SHED_PREDICTED, SHED_QUEUE_FULL
from engine.scheduling.request import FinishReason, Request

log = logging.getLogger(__name__)

Sink = Callable[[RequestOutput], None]
MAX_FAILURES_IN_A_ROW = 3      # contained failures with no good iteration between: the engine is broken
WATCHDOG_PERIOD_S = 0.5
IDLE_WAIT_S = 0.5              # the idle loop sleeps this long on the inbox; a whole wait empty gives memory back


class ShedError(RuntimeError):
    """Admission refused the request (engine/scheduling/admission.py: its predicted TTFT is over its
    class's target, or the waiting queue is at its bound); the client should retry in `retry_after_s`."""

    def __init__(self, message: str, reason: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class EngineLoop:
    def __init__(self, engine: LLMEngine, max_waiting: int, stall_s: float | None = None) -> None:
        """`stall_s`: a step running longer than this is the loop's death (None: never)."""
        self.engine = engine
        self.max_waiting = max_waiting
        self.stall_s = stall_s
        self.failure: str | None = None   # why the loop died; None while it serves
        self.on_failure: list[Callable[[str], None]] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._pending: dict[str, Request] = {}   # submitted, not yet moved into the engine
        self._pending_tokens = 0          # ... and their work left
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._beat = time.monotonic()     # the start of the loop's latest iteration
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)

    def start(self) -> None:
        self._beat = time.monotonic()
        self._thread.start()
        self._watchdog.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self._inbox.put(("wake", None, None))
        self._thread.join(1.0 if self.failure else timeout)   # a stuck thread is left to the process's exit

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + len(self._pending)

    @property
    def num_unfinished(self) -> int:
        return len(self._sinks) + len(self._pending)

    def token_load(self) -> tuple[int, int]:
        """(queued, running) tokens of work left: for each waiting (or just submitted) and each
        running request, its prompt tokens not yet computed plus the output tokens it may still
        generate (max_tokens). Read from another thread without stopping the loop: tuple() of a
        deque or list is one step under the GIL, and a count a step behind is good enough for a router."""
        scheduler = self.engine.scheduler
        waiting, running = tuple(scheduler.waiting), tuple(scheduler.running)
        return sum(map(_work_left, waiting)) + self._pending_tokens, sum(map(_work_left, running))

    def submit(self, request: Request, sink: Sink) -> None:
        """Queue the request, or raise ShedError (admission) or EngineFailed."""
        with self._lock:   # held through the put: a death after this check still finds the request in the inbox
            if self.failure is not None:
                raise EngineFailed(self.failure)
            self._admit(request)
            self._pending[request.request_id] = request
            self._pending_tokens += _work_left(request)
            self._inbox.put(("add", request, sink))

    def _admit(self, request: Request) -> None:
        """Admission's decision, on the submitting thread (it only reads the queues): a refusal is
        answered now, and reaches the engine's books (record_shed) through the inbox."""
        scheduler, now = self.engine.scheduler, time.monotonic()
        admission = scheduler.admission
        if self.num_waiting >= self.max_waiting:
            admission.count_shed(request.slo.name, SHED_QUEUE_FULL)
            self._inbox.put(("shed", request, None))
            raise ShedError(f"the waiting queue is full ({self.max_waiting} requests); retry later", SHED_QUEUE_FULL,
                            admission.retry_after(request, scheduler, now, self._pending.values()))
        decision = admission.decide(request, scheduler, now, self._pending.values())
        if not decision.admitted:
            self._inbox.put(("shed", request, None))
            raise ShedError(f"the server cannot give this request its first token within its {request.slo.name} "
                            f"class's {request.slo.ttft_s:g} s target (predicted {decision.predicted_ttft_s:.1f} s); "
                            f"retry later or elsewhere", SHED_PREDICTED, decision.retry_after_s)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id, None))

    def abort_all(self) -> None:
        self._inbox.put(("abort_all", None, None))

    # -- the loop thread --
    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:   # noqa: BLE001 (anything that got out is the loop's death, reported)
            log.critical("the engine loop died", exc_info=True)
            self._die(f"{type(e).__name__}: {' '.join(str(e).split())}"[:500])

    def _serve(self) -> None:
        failures = 0
        released = False  # what the last steps (or the start-up's calibration) left behind was given back
        while not self._stopping.is_set() and self.failure is None:   # a loop declared dead (stuck) stops
            self._beat = time.monotonic()
            try:
                idle = not self.engine.has_unfinished()
                self._drain(block=idle)
                if self.engine.has_unfinished():
                    self._deliver(self.engine.step())
                    released = False
                elif idle and not released:
                    # idle through an inbox wait (IDLE_WAIT_S) after the last step: not a gap between requests
                    self.engine.release_idle_memory()
                    released = True
                failures = 0
            except Exception:
                failures += 1
                if failures >= MAX_FAILURES_IN_A_ROW:
                    raise
                # a bug outside any one request: fail what is in flight (if that raises too, the loop dies)
                log.exception("engine step failed outside a request; failing in-flight requests")
                for request_id in list(self._sinks):
                    self._end(request_id, FinishReason.ERROR)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                self._handle(*item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _handle(self, kind: str, payload, sink: Sink | None) -> None:
        if kind == "shed":
            self.engine.record_shed(payload, time.monotonic())
        elif kind == "add":
            with self._lock:
                self._pending.pop(payload.request_id, None)
                self._pending_tokens -= _work_left(payload)
            self._sinks[payload.request_id] = sink
            try:
                self.engine.enqueue(payload)
            except Exception:  # a duplicate id: fail that client only
                log.exception("could not queue request %s", payload.request_id)
                self._sinks.pop(payload.request_id)
                sink(_error_output(payload.request_id, payload.num_prompt_tokens, []))
        elif kind == "abort":
            self._end(payload, FinishReason.ABORT)
        elif kind == "abort_all":
            for request_id in list(self._sinks):
                self._end(request_id, FinishReason.ABORT)

    def _end(self, request_id: str, reason: FinishReason) -> None:
        request = self.engine.requests.get(request_id)
        if request is None or not self.engine.abort(request_id, reason):
            return
        sink = self._sinks.pop(request_id, None)
        if sink:
            sink(RequestOutput(request_id, [], "", "", list(request.output_token_ids), request.num_prompt_tokens,
                               True, reason.value))

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            sink = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
            if sink is None:
                continue
            try:
                sink(out)
            except Exception:  # a broken consumer must not stop the loop
                log.exception("delivering output of %s failed", out.request_id)

    # -- death --
    def _watch(self) -> None:
        """Deaths the loop cannot report: its thread gone without a word, or stuck inside a step."""
        while not self._stopping.wait(WATCHDOG_PERIOD_S) and self.failure is None:
            if not self._thread.is_alive():
                self._die("the engine loop thread is gone")
            elif self.stall_s and time.monotonic() - self._beat > self.stall_s:
                log.critical("the engine loop is stuck in a step for over %.0f s", self.stall_s)
                self._die(f"the engine loop has not finished a step in {self.stall_s:.0f} s")

    def _die(self, reason: str) -> None:
        """Once, from any thread: record why, end every open request and queued submission with an
        error output (streams get an error chunk, others a 500), then tell the listeners."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = reason
        log.critical("engine loop failed: %s; ending %d open requests", reason, self.num_unfinished)
        ended = [(sink, request_id, self.engine.requests.get(request_id)) for request_id, sink in list(self._sinks.items())]
        self._sinks.clear()
        while True:
            try:
                kind, request, sink = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                ended.append((sink, request.request_id, request))
        with self._lock:
            self._pending.clear()
            self._pending_tokens = 0
        for sink, request_id, request in ended:
            tokens, prompt = (list(request.output_token_ids), request.num_prompt_tokens) if request else ([], 0)
            try:
                sink(_error_output(request_id, prompt, tokens))
            except Exception:
                log.exception("ending request %s failed", request_id)
        for listener in self.on_failure:
            listener(reason)


def _error_output(request_id: str, prompt_tokens: int, tokens: list[int]) -> RequestOutput:
    return RequestOutput(request_id, [], "", "", tokens, prompt_tokens, True, FinishReason.ERROR.value)


def _work_left(request: Request) -> int:
    prefill = max(0, request.num_prompt_tokens - request.num_computed_tokens)
    return prefill + max(0, request.max_tokens - len(request.output_token_ids))
