"""Soak traffic (benchmarks/soak.py): an open-loop load with bursts, clients that disconnect
mid-stream and requests that are malformed or invalid, against any OpenAI-compatible server.

Arrivals are a Poisson process at `rate_qps`, `burst_factor` times that for `burst_s` at the end of
every `burst_every_s`. Each arrival is, by a seeded draw, a normal streaming request (its lengths from
a workload, sent as loadgen.bench_client sends them, with a client timeout), a streaming request
whose client goes away after a few tokens, or one of MALFORMED. What counts is what the server
answers: never a 5xx, never an error inside a stream, never a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx
import numpy as np

from loadgen.bench_client import ENDPOINTS, BenchOptions, RequestResult, request_body, send_at
from loadgen.prompts import PromptSource
from loadgen.workload import RequestSpec, Workload, generate

MALFORMED = ("truncated_json", "negative_max_tokens", "unknown_fields", "prompt_too_long", "bad_token_ids",
             "bad_role")


@dataclass(frozen=True)
class SoakPlan:
    rate_qps: float                   # the base arrival rate
    duration_s: float
    burst_factor: float = 3.0
    burst_s: float = 30.0
    burst_every_s: float = 300.0
    disconnect_share: float = 0.2
    malformed_share: float = 0.1
    client_timeout_s: float = 120.0   # a normal client gives up (and disconnects) after this long
    context_tokens: int = 8192        # a prompt of more tokens than this is "longer than the context"
    seed: int = 0

    def in_burst(self, t: float) -> bool:
        return self.burst_every_s > 0 and t % self.burst_every_s >= self.burst_every_s - self.burst_s

    def rate_at(self, t: float) -> float:
        return self.rate_qps * (self.burst_factor if self.in_burst(t) else 1.0)

    def bursts(self) -> list[tuple[float, float]]:
        """[start, end) of each burst within the run."""
        if self.burst_every_s <= 0:
            return []
        ends = np.arange(self.burst_every_s, self.duration_s + self.burst_every_s, self.burst_every_s)
        return [(float(e - self.burst_s), float(min(e, self.duration_s))) for e in ends if e - self.burst_s < self.duration_s]


@dataclass(frozen=True)
class SoakRequest:
    index: int
    arrival_s: float
    kind: str                          # normal, disconnect or malformed
    spec: RequestSpec                  # lengths (normal, disconnect); arrival_s as above
    malformed: str | None = None       # one of MALFORMED
    keep_chunks: int = 0               # disconnect: tokens read before the client goes away


@dataclass
class SoakOutcome:
    index: int
    kind: str
    malformed: str | None
    sent_s: float | None = None
    status: int | None = None
    chunks: int = 0
    stream_error: str | None = None    # an error chunk inside a 200 stream: the server failed the request
    transport_error: str | None = None  # no response, or the connection dropped under the client
    timed_out: bool = False            # a normal client gave up after client_timeout_s

    @property
    def server_failure(self) -> bool:
        """What the soak must never see: a 5xx, an error inside a stream, a dropped connection."""
        return (self.status or 0) >= 500 or self.stream_error is not None or self.transport_error is not None


def arrival_times(plan: SoakPlan, rng: np.random.Generator) -> list[float]:
    """A Poisson process at plan.rate_at(t), by thinning one at the peak rate."""
    peak = plan.rate_qps * max(1.0, plan.burst_factor)
    times, t = [], 0.0
    while True:
        t += rng.exponential(1.0 / peak)
        if t >= plan.duration_s:
            return times
        if rng.random() < plan.rate_at(t) / peak:
            times.append(t)


def plan_requests(plan: SoakPlan, workload: Workload) -> list[SoakRequest]:
    rng = np.random.default_rng(plan.seed)
    times = arrival_times(plan, rng)
    lengths = generate(workload, qps=1.0, num_requests=max(1, len(times)), seed=plan.seed)
    requests = []
    for i, (t, spec) in enumerate(zip(times, lengths)):
        draw = rng.random()
        kind = ("malformed" if draw < plan.malformed_share else
                "disconnect" if draw < plan.malformed_share + plan.disconnect_share else "normal")
        malformed = MALFORMED[int(rng.integers(len(MALFORMED)))] if kind == "malformed" else None
        keep = int(rng.integers(1, max(2, min(8, spec.output_tokens // 2) + 1))) if kind == "disconnect" else 0
        requests.append(SoakRequest(i, t, kind, replace(spec, arrival_s=t), malformed, keep))
    return requests


def malformed_request(kind: str, model: str, context_tokens: int) -> tuple[str, bytes]:
    """(path, body) of a request a server must refuse with a 4xx (or, for unknown fields, serve)."""
    completion = {"model": model, "prompt": "Tell me about the harbour.", "max_tokens": 8}
    bodies: dict[str, tuple[str, Any]] = {
        "truncated_json": ("completions", json.dumps(completion)[:30]),
        "negative_max_tokens": ("completions", completion | {"max_tokens": -5}),
        "unknown_fields": ("completions", completion | {"frobnicate": {"level": 11}, "temperature_celsius": 20}),
        "prompt_too_long": ("completions", completion | {"prompt": [100] * (context_tokens + 64)}),
        "bad_token_ids": ("completions", completion | {"prompt": [-7, 10 ** 9, 5]}),
        "bad_role": ("chat", {"model": model, "max_tokens": 8, "messages": [{"role": "wizard", "content": "hi"}]}),
    }
    endpoint, body = bodies[kind]
    return ENDPOINTS[endpoint], (body if isinstance(body, str) else json.dumps(body)).encode()


async def run_soak(requests: list[SoakRequest], prompts: list[str | list[int]], options: BenchOptions, model: str,
                   plan: SoakPlan, progress_every_s: float = 60.0) -> tuple[list[SoakOutcome], list[RequestResult], float]:
    """Every request at its arrival time; (outcomes, the normal requests' results for latency, start).
    A line on stderr every `progress_every_s`: a long soak shows it is alive, and where it stands."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    outcomes = [SoakOutcome(r.index, r.kind, r.malformed) for r in requests]
    results = {r.index: RequestResult(r.index, r.spec) for r in requests if r.kind == "normal"}
    async with httpx.AsyncClient(base_url=options.root, headers=options.headers, limits=limits,
                                 timeout=httpx.Timeout(None, connect=30.0)) as client:
        start = time.monotonic()
        tasks = [asyncio.create_task(_one(client, start, r, prompt, model, options, plan, outcome, results))
                 for r, prompt, outcome in zip(requests, prompts, outcomes)]
        while True:
            done, pending = await asyncio.wait(tasks, timeout=progress_every_s)
            failures = sum(o.server_failure for o in outcomes)
            print(f"soak: {time.monotonic() - start:.0f} s, {len(done)}/{len(tasks)} requests done, "
                  f"{failures} server failures", file=sys.stderr, flush=True)
            if not pending:
                break
    return outcomes, list(results.values()), start


async def _one(client: httpx.AsyncClient, start: float, request: SoakRequest, prompt: str | list[int], model: str,
               options: BenchOptions, plan: SoakPlan, outcome: SoakOutcome, results: dict[int, RequestResult]) -> None:
    """One request; no client waits longer than client_timeout_s past its arrival (a normal one gives up,
    the others' silence is the server's failure)."""
    deadline = request.arrival_s + plan.client_timeout_s
    if request.kind == "normal":
        result = results[request.index]
        body = request_body(prompt, request.spec, model, options.endpoint)
        try:
            await asyncio.wait_for(send_at(client, start, result, body, ENDPOINTS[options.endpoint]), deadline)
        except TimeoutError:
            outcome.timed_out = True
            result.error = f"the client gave up after {plan.client_timeout_s:g} s"
        _from_result(outcome, result, start)
        return
    await asyncio.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
    outcome.sent_s = time.monotonic() - start
    try:
        await asyncio.wait_for(_other(client, request, prompt, model, options, plan, outcome), plan.client_timeout_s)
    except TimeoutError:
        outcome.transport_error = f"no answer within {plan.client_timeout_s:g} s"
    except httpx.HTTPError as e:
        outcome.transport_error = f"{type(e).__name__}: {e}"


async def _other(client: httpx.AsyncClient, request: SoakRequest, prompt: str | list[int], model: str,
                 options: BenchOptions, plan: SoakPlan, outcome: SoakOutcome) -> None:
    if request.kind == "disconnect":
        await _disconnect(client, request, prompt, model, options, outcome)
        return
    path, content = malformed_request(request.malformed, model, plan.context_tokens)
    response = await client.post(path, content=content, headers={"content-type": "application/json"})
    outcome.status = response.status_code


async def _disconnect(client: httpx.AsyncClient, request: SoakRequest, prompt: str | list[int], model: str,
                      options: BenchOptions, outcome: SoakOutcome) -> None:
    """Reads `keep_chunks` token chunks, then leaves: closing the stream is the client going away."""
    body = request_body(prompt, request.spec, model, options.endpoint)
    async with client.stream("POST", ENDPOINTS[options.endpoint], json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            return
        async for line in response.aiter_lines():
            if line.startswith('data: {"error"'):
                outcome.stream_error = line[6:200]
                return
            if line.startswith("data: {"):
                outcome.chunks += 1
                if outcome.chunks >= request.keep_chunks:
                    return


def _from_result(outcome: SoakOutcome, result: RequestResult, start: float) -> None:
    outcome.sent_s = None if result.sent is None else result.sent - start
    outcome.status = result.status
    outcome.chunks = len(result.chunk_times)
    error = result.error or ""
    if error.startswith("stream error"):
        outcome.stream_error = error
    elif result.status is None and error and not outcome.timed_out:
        outcome.transport_error = error
    elif result.status == 200 and error and not outcome.timed_out:   # a stream cut short, or not JSON
        outcome.transport_error = error


def outcome_counts(outcomes: list[SoakOutcome]) -> dict[str, Any]:
    """Status counts per kind (and per malformed request), failures and time-outs."""
    def count(items) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in items:
            key = str(o.status) if o.status is not None else "no response"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    by_kind = {kind: count([o for o in outcomes if o.kind == kind]) for kind in ("normal", "disconnect", "malformed")}
    malformed = {m: count([o for o in outcomes if o.malformed == m]) for m in MALFORMED}
    failures = [asdict(o) for o in outcomes if o.server_failure]
    return {"requests": len(outcomes), "status": count(outcomes), "status_by_kind": by_kind,
            "status_by_malformed": malformed,
            "http_5xx": sum((o.status or 0) >= 500 for o in outcomes),
            "stream_errors": sum(o.stream_error is not None for o in outcomes),
            "transport_errors": sum(o.transport_error is not None for o in outcomes),
            "client_timeouts": sum(o.timed_out for o in outcomes),
            "server_failures": len(failures), "first_failures": failures[:10]}


def prompts_for(requests: list[SoakRequest], source: PromptSource, text: bool) -> list[str | list[int]]:
    """Built before the run (tokenizing never delays a send); malformed requests build their own."""
    ids = [source.prompt_ids(r.spec.prompt_tokens, r.spec.prefix_group, r.spec.prefix_tokens)
           if r.kind != "malformed" else [] for r in requests]
    return [source.tokenizer.decode(i) for i in ids] if text else ids
