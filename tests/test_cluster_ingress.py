"""The ingress's retry rule without Ray running: faked replica handles answer each request with a
chosen head and body (a shed is 429 with Retry-After, before any body byte), and the ingress's own
_proxy routes, retries and relays. Shed load goes to another replica; when every replica sheds, the
client gets one 429 with the smallest Retry-After; a 429 without Retry-After is relayed; a request
tried on several replicas is one arrival of demand for the planner."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")

from starlette.requests import Request  # noqa: E402

from cluster.asgi_call import ResponseHead  # noqa: E402
from cluster.cluster_spec import ClusterSpec  # noqa: E402
from cluster.ingress import REPLICA_HEADER, Ingress, shed_retry_after  # noqa: E402
from cluster.planner_config import PlannerConfig  # noqa: E402
from cluster.planner_service import PlannerService  # noqa: E402
from cluster.replica_telemetry import ReplicaTelemetry  # noqa: E402
from cluster.router import ReplicaLoad, Router, RouterConfig  # noqa: E402
from cluster.router_metrics import RouterMetrics  # noqa: E402
from engine.model.tokenizer import ByteTokenizer  # noqa: E402

JSON = ("content-type", "application/json")
SSE = ("content-type", "text/event-stream")


def shed(retry_after: str | None, code: str = "overloaded") -> tuple[int, list, list[bytes]]:
    headers = [JSON] + ([("retry-after", retry_after)] if retry_after is not None else [])
    body = {"error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": code}}
    return 429, headers, [json.dumps(body).encode()]


def ok(name: str) -> tuple[int, list, list[bytes]]:
    return 200, [JSON], [json.dumps({"served_by": name}).encode()]


class FakeStream:
    """A DeploymentResponseGenerator of one answer: its head, then its body's chunks."""

    def __init__(self, status: int, headers: list, chunks: list[bytes]) -> None:
        self.parts = [ResponseHead(status, headers), *chunks]
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self):
        if not self.parts:
            raise StopAsyncIteration
        return self.parts.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class FakeHandle:
    """A replica's DeploymentHandle: `options(stream=True).handle_http.remote(call)`."""

    def __init__(self, answer: tuple[int, list, list[bytes]]) -> None:
        self.answer, self.streams = answer, []
        self.handle_http = self

    def options(self, stream: bool) -> FakeHandle:
        return self

    def remote(self, call) -> FakeStream:
        self.streams.append(FakeStream(*self.answer))
        return self.streams[-1]


def ingress(answers: dict[str, tuple], planner: bool = False):
    """An Ingress routing to healthy faked replicas, not polling: the class as written (Serve's
    deployment wraps a subclass of it, for its ASGI app), its attributes as __init__ sets them."""
    ing = object.__new__(Ingress.func_or_class.__bases__[0])
    names = list(answers)
    ing.spec = ClusterSpec(replicas=len(names), router=RouterConfig(load_timeout_s=0.2))
    ing.names, ing.handles = names, {n: FakeHandle(a) for n, a in answers.items()}
    ing.router = Router(names)
    for n in names:
        ing.router.update(n, ReplicaLoad(incarnation="1"))
    ing.planner = None if not planner else PlannerService(
        PlannerConfig(max_replicas=len(names), interval_s=1.0, replica_capacity_rps=1.0), names, names,
        ing.router, None)
    ing.block_size, ing.default_max_tokens = 16, 16
    ing.tokenizer = ByteTokenizer(300)
    ing.metrics = RouterMetrics()
    ing._pollers = [None]                        # no load polling: every replica stays healthy
    return ing


def post(ing, body: dict | None = None, path: str = "/v1/completions"):
    raw = json.dumps(body or {"prompt": "Once upon a time", "max_tokens": 8}).encode()

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}
    return asyncio.run(ing._proxy(Request(scope, receive), path))


def sample(ing, name: str, **labels) -> float:
    value = ing.metrics.registry.get_sample_value(name, labels or None)
    return value or 0.0


def calls(ing) -> dict[str, int]:
    return {n: len(h.streams) for n, h in ing.handles.items()}


def test_a_shed_request_is_served_by_another_replica():
    ing = ingress({"a": shed("3"), "b": ok("b")})
    response = post(ing)
    assert response.status_code == 200 and response.headers[REPLICA_HEADER] == "b"
    assert json.loads(response.body) == {"served_by": "b"}
    assert calls(ing) == {"a": 1, "b": 1} and ing.handles["a"].streams[0].cancelled
    assert sample(ing, "autotuned:router_replica_sheds_total", replica="a") == 1
    assert sample(ing, "autotuned:router_shed_requests_total") == 0
    assert sample(ing, "autotuned:router_retries_total", replica="a") == 0      # a shed is not a failure
    assert ing.router.loads["a"].healthy                                         # busy, not broken


def test_a_shed_stream_is_served_by_another_replica_before_any_byte():
    events = [b'data: {"choices": []}\n\n', b"data: [DONE]\n\n"]
    ing = ingress({"a": shed("2"), "b": (200, [SSE], events)})
    response = post(ing, {"prompt": "Once upon a time", "max_tokens": 8, "stream": True})

    async def body() -> bytes:
        return b"".join([chunk async for chunk in response.body_iterator])

    assert response.status_code == 200 and response.headers[REPLICA_HEADER] == "b"
    assert asyncio.run(body()) == b"".join(events)


def test_when_every_replica_sheds_the_client_gets_one_429_with_the_smallest_retry_after():
    ing = ingress({"a": shed("7"), "b": shed("2", "queue_full"), "c": shed("5", "deadline_expired")})
    response = post(ing)
    assert response.status_code == 429 and response.headers["retry-after"] == "2"
    error = json.loads(response.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("rate_limit_error", None, "overloaded")
    assert calls(ing) == {"a": 1, "b": 1, "c": 1}                                 # each replica once
    assert sample(ing, "autotuned:router_shed_requests_total") == 1
    assert sum(sample(ing, "autotuned:router_replica_sheds_total", replica=r) for r in "abc") == 3


def test_a_429_without_retry_after_is_relayed_not_retried():
    ing = ingress({"a": shed(None, "rate_limit"), "b": ok("b")})
    response = post(ing)
    assert response.status_code == 429 and response.headers[REPLICA_HEADER] == "a"
    assert "retry-after" not in response.headers
    assert json.loads(response.body)["error"]["code"] == "rate_limit"
    assert calls(ing) == {"a": 1, "b": 0}
    assert sample(ing, "autotuned:router_replica_sheds_total", replica="a") == 0


def test_a_503_keeps_its_rule_and_a_shed_elsewhere_makes_the_answer_429():
    unavailable = (503, [JSON, ("retry-after", "5")], [b'{"error": {"code": "not_ready"}}'])
    relayed = post(ingress({"a": unavailable, "b": unavailable}))               # the last replica's 503
    assert relayed.status_code == 503 and relayed.headers[REPLICA_HEADER] == "b"
    for answers in ({"a": unavailable, "b": shed("4", "queue_full")}, {"a": shed("4", "queue_full"), "b": unavailable}):
        response = post(ingress(answers))                                        # the ingress's own 429
        assert response.status_code == 429 and response.headers["retry-after"] == "4"
        assert REPLICA_HEADER not in response.headers and json.loads(response.body)["error"]["code"] == "overloaded"


def test_a_retried_request_counts_once_as_demand():
    served = ingress({"a": shed("3"), "b": ok("b")}, planner=True)
    post(served)
    # the replicas' books: a booked its shed finished and missed, b served it within its SLO
    books = ReplicaTelemetry.total([ReplicaTelemetry(finished=1, met=0), ReplicaTelemetry(finished=1, met=1)])
    seen = served.planner.telemetry(books)
    assert (seen.arrivals, seen.finished, seen.attainment, seen.shed) == (1, 1, 1.0, 0)

    refused = ingress({"a": shed("3"), "b": shed("1")}, planner=True)
    post(refused)
    books = ReplicaTelemetry.total([ReplicaTelemetry(finished=1, met=0), ReplicaTelemetry(finished=1, met=0)])
    seen = refused.planner.telemetry(books)
    assert (seen.arrivals, seen.finished, seen.attainment, seen.shed) == (1, 1, 0.0, 1)   # one miss of demand
    assert refused.planner.telemetry(ReplicaTelemetry()).shed == 0                         # counts start again


def test_retry_after_is_read_in_whole_seconds_at_least_one():
    def head(status: int, *headers: tuple[str, str]) -> ResponseHead:
        return ResponseHead(status, list(headers))

    assert shed_retry_after(head(429, ("Retry-After", " 12 "))) == 12
    assert shed_retry_after(head(429, ("retry-after", "0"))) == 1
    assert shed_retry_after(head(429, ("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"))) is None
    assert shed_retry_after(head(429)) is None
    assert shed_retry_after(head(503, ("retry-after", "5"))) is None
