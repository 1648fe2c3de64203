"""The cluster's front door: the same OpenAI API as one daemon, each request sent to the replica
the router picks (cluster/router.py) and its response relayed as it comes.

Failures: a replica that fails before its response begins (killed, restarting, or answering 503
while loading or draining) is marked unhealthy and the request goes to another one; once a
response has begun it cannot be retried, so a stream cut by a replica's death ends with an
OpenAI-style error event and `[DONE]`, and a buffered response with a 502. The other replicas
keep serving meanwhile, and Serve restarts the dead one (its load answers again: healthy).

Overload: a replica that sheds a request (429 with Retry-After, before its response begins) may
only be the busy one, so the request goes to another replica not yet tried; when every replica
has shed it (or none other is left), the ingress answers 429 itself with the smallest Retry-After
they gave. A 429 without Retry-After is a limit on the client, not load: relayed as it is.
"""

# no `from __future__ import annotations`: FastAPI must see the handlers' real types (Request)

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from cluster.asgi_call import HttpCall, ResponseHead
from cluster.cluster_spec import ClusterSpec
from cluster.planner_service import PlannerService
from cluster.replica_telemetry import ReplicaTelemetry
from cluster.prompt_key import NO_KEY, route_key
from cluster.router import Decision, NoReplicaError, Router
from cluster.router_metrics import RouterMetrics
from cluster.serve_scaling import scale_deployment
from loadgen.prompts import load_prompt_tokenizer
from serving.openai_protocol import error_body
from telemetry.constant_labels import render

log = logging.getLogger(__name__)
REPLICA_FAILURES = (RayError, RayServeException)
REPLICA_HEADER = "x-autotuned-replica"       # which replica answered (clients, tests, benchmarks)
DROPPED_HEADERS = {"content-length", "transfer-encoding", "connection"}

app = FastAPI(title="autotuned-serve cluster", version="0.1.0")


# Helpers come before the class: Serve pickles the decorated class as the module stands then.
def _error(status: int, message: str, type_: str, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code=code), status, headers)


def _overloaded(retry_after: int) -> JSONResponse:
    return _error(429, f"every replica is overloaded; retry in {retry_after} s", "rate_limit_error",
                  code="overloaded", headers={"Retry-After": str(retry_after)})


def shed_retry_after(head: ResponseHead) -> int | None:
    """The Retry-After (whole seconds, at least 1) of a replica's 429 that shed load; None for any
    other answer, a 429 without it (or with a date) included."""
    if head.status != 429:
        return None
    value = next((v.strip() for k, v in head.headers if k.lower() == "retry-after"), "")
    return max(1, int(value)) if value.isascii() and value.isdigit() else None


def _quantile(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, spec: ClusterSpec, replicas: list[DeploymentHandle]) -> None:
        self.spec = spec
        self.names = spec.replica_names()
        self.handles = dict(zip(self.names, replicas))
        settings = spec.daemon_settings()
        self.model = spec.served_model_name
        self.router = Router(spec.initial_replicas(), spec.router, settings.block_size)
        self.planner = None if spec.planner is None else PlannerService(
            spec.planner, self.names, spec.initial_replicas(), self.router, self._scale)
        self.block_size, self.default_max_tokens = settings.block_size, settings.default_max_tokens
        self.tokenizer = load_prompt_tokenizer(settings.model)
        self.metrics = RouterMetrics()
        self._pollers: list[asyncio.Task] = []

    # -- the API --
    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                            "owned_by": "autotuned-serve"}]}

    @app.get("/health")
    async def health(self) -> JSONResponse:
        self._start_polling()
        healthy = self.router.healthy()
        status = {"status": "ok" if healthy else "unavailable",
                  "replicas": {r: self.router.loads[r].healthy for r in self.router.replicas}}
        return JSONResponse(status, 200 if healthy else 503)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        self._start_polling()
        families = list(self.metrics.registry.collect())
        answers = await asyncio.gather(*(asyncio.wait_for(h.metric_families.remote(), self.spec.router.load_timeout_s)
                                         for h in self.handles.values()), return_exceptions=True)
        for answer in answers:
            if not isinstance(answer, BaseException):
                families.extend(answer)
        return Response(render(families), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/cluster/replicas")
    async def replicas(self) -> dict:
        """The router's view: each replica's health and load, and its recent overheads."""
        self._start_polling()
        overheads = sorted(self.metrics.recent_overheads)
        return {"policy": self.spec.router.policy,
                "replicas": {r: {"healthy": self.router.loads[r].healthy, "load_tokens": self.router.load_tokens(r),
                                 "incarnation": self.router.loads[r].incarnation} for r in self.router.replicas},
                "indexed_blocks": len(self.router.index),
                "planner": self.planner.status() if self.planner else None,
                "overhead_s": {"count": len(overheads), "p50": _quantile(overheads, 0.5),
                               "p99": _quantile(overheads, 0.99)}}

    @app.api_route("/replicas/{name}/{path:path}", methods=["GET", "POST"])
    async def one_replica(self, name: str, path: str, request: Request) -> Response:
        """A replica's own endpoints (/metrics, /admin/..., /health), unrouted."""
        if name not in self.handles:
            return _error(404, f"no replica named {name!r}; replicas: {', '.join(self.names)}", "not_found_error")
        return await self._proxy(request, "/" + path, replica=name)

    # -- routing --
    async def _proxy(self, request: Request, path: str, replica: str | None = None) -> Response:
        start = time.perf_counter()
        self._start_polling()
        body = await request.body()
        call = HttpCall(request.method, path, request.url.query, list(request.headers.items()), body)
        key = (route_key(path, body, self.tokenizer, self.block_size, self.default_max_tokens)
               if replica is None else NO_KEY)
        tried: list[str] = []
        shed: list[int] = []                  # the Retry-After of each replica that shed it
        while True:
            decision = await self._choose(key, tried, replica, wait=not shed)
            if decision is None:
                return self._unserved(shed)
            if not tried:                     # once per request: a retry is the same demand
                self.metrics.on_decision(decision, time.perf_counter() - start)
                if self.planner and replica is None:
                    self.planner.on_routed(key.prompt_tokens, key.output_tokens, decision.cached_tokens)
            head, stream = await self._send(decision.replica, call)
            retry_after = None if head is None else shed_retry_after(head)
            if head is not None:
                if replica is not None or not self._send_on(head, retry_after, tried, shed):
                    return await self._respond(head, stream, decision.replica)
                stream.cancel()               # the replica aborts it; another one may serve it now
                self._done(decision.replica)
            elif replica is not None:
                return _error(502, f"replica {replica} failed", "server_error", code="replica_failed")
            tried.append(decision.replica)
            self._count_resend(decision.replica, retry_after, shed)

    async def _send(self, replica: str, call: HttpCall) -> tuple[ResponseHead | None, DeploymentResponseGenerator]:
        """The replica's response head, or None (marked unhealthy) when it failed before answering."""
        stream = self.handles[replica].options(stream=True).handle_http.remote(call)
        self._sent(replica)
        try:
            return await anext(stream), stream
        except REPLICA_FAILURES as e:
            log.warning("replica %s failed before answering (%s); trying another", replica, type(e).__name__)
            self.router.mark_unhealthy(replica)
            self._done(replica)
            return None, stream

    def _send_on(self, head: ResponseHead, retry_after: int | None, tried: list[str], shed: list[int]) -> bool:
        """Whether another replica should get the request after this answer: always after a shed
        (with none left, the ingress answers 429); after a 503 (loading, draining) while another
        replica is left, or when an earlier one shed it (then load, not absence, is the answer)."""
        if retry_after is not None:
            return True
        return head.status == 503 and (bool(shed) or len(tried) + 1 < len(self.router.replicas))

    def _count_resend(self, replica: str, retry_after: int | None, shed: list[int]) -> None:
        if retry_after is None:
            self.metrics.retries.labels(replica).inc()
            return
        shed.append(retry_after)
        self.metrics.replica_sheds.labels(replica).inc()
        if self.planner:
            self.planner.on_shed()

    def _unserved(self, shed: list[int]) -> JSONResponse:
        """No replica left to try: 429 when one shed it (the fleet is overloaded), else 503."""
        if not shed:
            return _error(503, "no replica is available; retry later", "service_unavailable",
                          code="no_replica", headers={"Retry-After": "1"})
        self.metrics.shed_requests.inc()
        if self.planner:
            self.planner.on_overloaded()
        return _overloaded(min(shed))

    async def _choose(self, key, tried: list[str], replica: str | None, wait: bool = True) -> Decision | None:
        """The router's pick; with none healthy (start-up, all restarting) waits up to the load
        timeout for one to answer, unless `wait` is off (a replica already shed the request: its
        429 is the answer rather than a wait)."""
        if replica is not None:
            return Decision(replica, "direct", 0, 0)
        deadline = time.monotonic() + self.spec.router.load_timeout_s
        while True:
            try:
                return self.router.choose(key.block_keys, key.prompt_tokens, key.output_tokens, exclude=tried)
            except NoReplicaError:
                if not wait or time.monotonic() > deadline or len(tried) >= len(self.router.replicas):
                    return None
                await asyncio.sleep(0.05)

    async def _respond(self, head: ResponseHead, stream: DeploymentResponseGenerator, replica: str) -> Response:
        headers = {k: v for k, v in head.headers if k.lower() not in DROPPED_HEADERS} | {REPLICA_HEADER: replica}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(self._relay(stream, replica), head.status, headers)
        try:
            body = b"".join([chunk async for chunk in stream])
        except REPLICA_FAILURES:
            self.router.mark_unhealthy(replica)
            self.metrics.failed.labels(replica).inc()
            return _error(502, "the replica serving this request failed", "server_error", code="replica_failed")
        finally:
            self._done(replica)
        return Response(body, head.status, headers)

    async def _relay(self, stream: DeploymentResponseGenerator, replica: str) -> AsyncIterator[bytes]:
        try:
            async for chunk in stream:
                yield chunk
        except REPLICA_FAILURES:
            log.warning("replica %s failed mid-stream", replica)
            self.router.mark_unhealthy(replica)
            self.metrics.failed.labels(replica).inc()
            error = error_body("the replica serving this request failed", "server_error", code="replica_failed")
            yield f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()
        finally:
            stream.cancel()              # a client gone away: the replica aborts the request
            self._done(replica)

    # -- the planner (cluster/planner_service.py) --
    def _sent(self, replica: str) -> None:
        if self.planner:
            self.planner.sent(replica)

    def _done(self, replica: str) -> None:
        if self.planner:
            self.planner.done(replica)

    async def _scale(self, replica: str, count: int) -> None:
        await scale_deployment(serve.get_replica_context().app_name, replica, count)

    async def _ask_telemetry(self, names: list[str], seconds: float) -> list[ReplicaTelemetry]:
        answers = await asyncio.gather(*(asyncio.wait_for(self.handles[n].telemetry.remote(seconds),
                                                          self.spec.router.load_timeout_s) for n in names),
                                       return_exceptions=True)
        return [a for a in answers if isinstance(a, ReplicaTelemetry)]

    # -- the replicas' loads --
    def _start_polling(self) -> None:
        if not self._pollers:
            loop = asyncio.get_running_loop()
            self._pollers = [loop.create_task(self._poll(name)) for name in self.names]
            if self.planner:
                self._pollers.append(loop.create_task(self.planner.run(self._ask_telemetry)))

    async def _poll(self, name: str) -> None:
        config = self.spec.router
        while True:
            if name not in self.router.replicas:       # at 0 replicas, or leaving: nothing to ask
                await asyncio.sleep(config.load_interval_s)
                continue
            try:
                load = await asyncio.wait_for(self.handles[name].load.remote(), config.load_timeout_s)
                self.router.update(name, load)
            except (asyncio.TimeoutError, *REPLICA_FAILURES):
                self.router.mark_unhealthy(name)
            except Exception:
                log.exception("asking replica %s for its load failed", name)
                self.router.mark_unhealthy(name)
            self.metrics.on_loads(self.router)
            await asyncio.sleep(config.load_interval_s)

