"""Open-loop benchmark client for any OpenAI-compatible server (vLLM's and Sarathi-Serve's method).

Every RequestSpec is sent at its arrival time whatever the server is doing (a closed loop would
slow its own arrivals down and hide overload), streaming /v1/completions with max_tokens and
ignore_eos so output lengths are exact. Timestamps are taken on the client as SSE chunks arrive;
token counts come from the final usage chunk since one chunk may carry several tokens.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from tqdm import tqdm

from loadgen.capacity import probe_size
from loadgen.prompts import PromptSource
from loadgen.workload import RequestSpec, Workload, generate
from engine.outputs import RequestRecord
from engine.slo_class import SloClass, shipped_slo_classes
from telemetry.latency_summary import LatencySummary, summarize_requests


ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# a constrained request's schema (RequestSpec.constrained): records of keys, numbers, strings and enums, more of
# them than any max_tokens reaches, so the answer is held to the grammar at every token and, like ignore_eos,
# runs to exactly max_tokens
BENCH_SCHEMA = {"type": "array", "minItems": 100000, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "score", "tags"],
    "properties": {"id": {"type": "integer", "minimum": 0}, "name": {"type": "string", "maxLength": 32},
                   "score": {"type": "number", "minimum": 0, "maximum": 1},
                   "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["new", "used", "rare", "sale"]}}}}}


class BenchError(ValueError):
    """The server cannot be benchmarked (unreachable, no model); one line for the command line."""


@dataclass(frozen=True)
class BenchOptions:
    base_url: str                     # the server root, e.g. http://127.0.0.1:8000
    model: str | None = None          # None: the first model GET /v1/models lists
    text_prompts: bool = False        # send decoded text instead of token ids
    endpoint: str = "completions"     # or "chat": /v1/chat/completions, one user message (always text)
    api_key: str | None = None
    max_duration_s: float = 600.0     # requests unfinished by then are cancelled and count as failed
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.max_duration_s > 0:
            raise ValueError(f"max_duration_s must be > 0, got {self.max_duration_s}")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r} (known: {', '.join(ENDPOINTS)})")

    @property
    def sends_text(self) -> bool:
        return self.text_prompts or self.endpoint == "chat"

    @property
    def root(self) -> str:
        """The server root: a trailing /v1 is accepted and dropped, as OpenAI clients take one."""
        url = self.base_url.rstrip("/")
        return url.removesuffix("/v1")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestResult:
    """One request's raw client-side data; times are time.monotonic()."""

    index: int
    spec: RequestSpec
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)   # arrival of each chunk with a choice
    output_tokens: int | None = None          # from usage; chunk count when the server sends none
    server_prompt_tokens: int | None = None
    finish_reason: str | None = None
    finished: float | None = None
    error: str | None = None
    status: int | None = None                 # the HTTP status; None where no response came
    answered: float | None = None             # when the response's status line came
    retry_after: str | None = None            # a refusal's Retry-After header
    error_code: str | None = None             # an error reply's OpenAI `code` (e.g. overloaded, deadline_expired)

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_reason is not None and self.finished is not None

    def record(self, end: float) -> RequestRecord:
        sent = self.sent if self.sent is not None else end
        slo_class, slo_ttft_s, slo_tbt_s = record_class(self.spec.slo_class)
        return RequestRecord(
            request_id=str(self.index), arrival=sent, first_token=self.chunk_times[0] if self.chunk_times else None,
            finished=self.finished if self.ok else end, token_times=tuple(self.chunk_times),
            num_prompt_tokens=self.server_prompt_tokens or self.spec.prompt_tokens,
            num_output_tokens=self.num_output_tokens, max_tokens=self.spec.output_tokens,
            finish_reason=self.finish_reason if self.ok else ("error" if self.error else "abort"), num_preemptions=0,
            slo_class=slo_class, slo_ttft_s=slo_ttft_s, slo_tbt_s=slo_tbt_s)

    @property
    def num_output_tokens(self) -> int:
        return self.output_tokens if self.output_tokens is not None else len(self.chunk_times)

    def as_dict(self, start: float) -> dict[str, Any]:
        """JSON-ready, times in seconds from the start of the run."""
        rel = (lambda t: None if t is None else t - start)
        return {"index": self.index, **asdict(self.spec), "sent_s": rel(self.sent),
                "first_token_s": rel(self.chunk_times[0]) if self.chunk_times else None,
                "finished_s": rel(self.finished), "chunk_times_s": [t - start for t in self.chunk_times],
                "num_output_tokens": self.num_output_tokens, "server_prompt_tokens": self.server_prompt_tokens,
                "finish_reason": self.finish_reason, "error": self.error, "status": self.status,
                "answered_s": rel(self.answered), "retry_after": self.retry_after}


@dataclass(frozen=True)
class BenchRun:
    summary: LatencySummary
    results: list[RequestResult]
    start: float
    model: str

    def as_dict(self) -> dict[str, Any]:
        return {**self.summary.as_dict(), "model": self.model,
                "requests": [r.as_dict(self.start) for r in self.results]}


def record_class(name: str | None) -> tuple[str, float | None, float | None]:
    """(class, TTFT target, TBT target) of a request: the shipped class's targets where the name is one
    of configs/slo_classes.yaml; None (judged by the run's SLO) for the default or a class the server
    alone defines."""
    shipped = shipped_slo_classes()
    if name is None:
        return shipped.default, None, None
    known = shipped.classes.get(name)
    return (name, known.ttft_s, known.tbt_s) if known else (name, None, None)


def resolve_model_name(options: BenchOptions) -> str:
    if options.model:
        return options.model
    try:
        r = httpx.get(options.root + "/v1/models", headers=options.headers, timeout=10)
        r.raise_for_status()
        return r.json()["data"][0]["id"]
    except httpx.HTTPError as e:
        raise BenchError(f"cannot list models at {options.root}/v1/models: {e}") from e
    except (KeyError, IndexError, ValueError) as e:
        raise BenchError(f"{options.root}/v1/models lists no model; pass --model") from e


def make_prompts(specs: list[RequestSpec], source: PromptSource, text: bool) -> list[str | list[int]]:
    """Built before the run so tokenizing never delays a send. Requests of one prefix group start
    with the same tokens (text), so a server with prefix caching can reuse them. A request with its
    own message (code-editing) sends that."""
    prompts: list[str | list[int]] = []
    for s in specs:
        if s.message is not None:
            prompts.append(s.message)
            continue
        ids = source.prompt_ids(s.prompt_tokens, s.prefix_group, s.prefix_tokens)
        prompts.append(source.tokenizer.decode(ids) if text else ids)
    return prompts


def request_endpoint(spec: RequestSpec, options: BenchOptions) -> str:
    """A request with its own message is a chat request whatever the run's endpoint: the message is
    written for a chat model, and the server's chat template makes its prompt."""
    return "chat" if spec.message is not None else options.endpoint


def run_bench(specs: list[RequestSpec], prompts: list[str | list[int]], options: BenchOptions, slo: SloClass,
              model: str | None = None) -> BenchRun:
    model = model or resolve_model_name(options)
    return asyncio.run(_run(specs, prompts, options, slo, model))


async def _run(specs: list[RequestSpec], prompts: list[str | list[int]], options: BenchOptions, slo: SloClass,
               model: str) -> BenchRun:
    results = [RequestResult(i, s) for i, s in enumerate(specs)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # never queue on our side
    timeout = httpx.Timeout(None, connect=30.0)
    bar = tqdm(total=len(specs), desc="requests", unit="req", disable=not options.progress)
    async with httpx.AsyncClient(base_url=options.root, headers=options.headers, limits=limits,
                                 timeout=timeout) as client:
        start = time.monotonic()
        endpoints = [request_endpoint(r.spec, options) for r in results]
        tasks = [asyncio.create_task(send_at(client, start, r, request_body(prompt, r.spec, model, endpoint),
                                             ENDPOINTS[endpoint], bar))
                 for r, prompt, endpoint in zip(results, prompts, endpoints)]
        _, pending = await asyncio.wait(tasks, timeout=options.max_duration_s) if tasks else (set(), set())
        for task in pending:     # closing the stream makes the server abort the request
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        end = time.monotonic()
    bar.close()
    for r in results:
        if not r.ok and r.error is None:
            r.error = f"not finished within {options.max_duration_s:g} s"
    summary = summarize_requests([r.record(end) for r in results], slo, max(end - start, 1e-9))
    return BenchRun(summary, results, start, model)


def request_body(prompt: str | list[int], spec: RequestSpec, model: str, endpoint: str) -> dict[str, Any]:
    """A streaming request for `spec`: exactly spec.output_tokens tokens (ignore_eos), usage in the last chunk."""
    body: dict[str, Any] = {"model": model, "max_tokens": spec.output_tokens, "ignore_eos": True, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if spec.slo_class is not None:
        body["slo_class"] = spec.slo_class
    if spec.constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "records", "schema": BENCH_SCHEMA}}
    if endpoint == "chat":
        return {**body, "messages": [{"role": "user", "content": prompt}], "max_completion_tokens": spec.output_tokens}
    return {**body, "prompt": prompt}


async def send_at(client: httpx.AsyncClient, start: float, result: RequestResult, body: dict[str, Any],
                  path: str, bar: tqdm | None = None) -> None:
    """Sends `body` at start + the spec's arrival time and reads its stream into `result`."""
    await asyncio.sleep(max(0.0, start + result.spec.arrival_s - time.monotonic()))
    try:
        result.sent = time.monotonic()
        async with client.stream("POST", path, json=body) as response:
            result.status, result.answered = response.status_code, time.monotonic()
            if response.status_code != 200:
                result.retry_after = response.headers.get("retry-after")
                body = await response.aread()
                result.error, result.error_code = f"HTTP {response.status_code}: {_error_message(body)}", _error_code(body)
                return
            await _read_stream(response, result)
    except (httpx.HTTPError, ValueError) as e:     # ValueError: a chunk that is not JSON
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if bar is not None:
            bar.update(1)


async def _read_stream(response: httpx.Response, result: RequestResult) -> None:
    last_empty_closing = False
    async for line in response.aiter_lines():
        now = time.monotonic()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            result.error = f"stream error: {_error_message(data.encode())}"
            return
        for choice in event.get("choices") or []:
            if _brings_tokens(choice):
                result.chunk_times.append(now)
                last_empty_closing = _is_empty_closing(choice)
            result.finish_reason = choice.get("finish_reason") or result.finish_reason
        usage = event.get("usage")
        if usage:
            result.output_tokens = usage.get("completion_tokens")
            result.server_prompt_tokens = usage.get("prompt_tokens")
    _drop_closing_chunk(result, last_empty_closing)
    if result.finish_reason is None:
        result.error = "the stream ended without a finish_reason"
    else:
        result.finished = result.chunk_times[-1] if result.chunk_times else time.monotonic()


def _brings_tokens(choice: dict[str, Any]) -> bool:
    """As vLLM's bench: any completions choice; a chat delta only with content (not the role-only first one)."""
    delta = choice.get("delta")
    return delta is None or bool(delta.get("content") or delta.get("reasoning_content"))


def _is_empty_closing(choice: dict[str, Any]) -> bool:
    """A completions chunk with no text that ends the stream: llama.cpp's server sends the finish
    reason alone after the last token, while a server whose last token's text was held back (an
    incomplete UTF-8 character) sends the same shape for a real token; usage tells them apart."""
    return "delta" not in choice and not choice.get("text") and bool(choice.get("finish_reason"))


def _drop_closing_chunk(result: RequestResult, last_empty_closing: bool) -> None:
    """One chunk more than the usage's tokens, the last an empty closing one: not a token (counted,
    it gave llama.cpp a ~0 s gap per request in its P99 TBT)."""
    if last_empty_closing and result.output_tokens is not None and len(result.chunk_times) > result.output_tokens:
        result.chunk_times.pop()


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]


def _error_code(body: bytes) -> str | None:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return None if code is None else str(code)


# ---- composition: workload -> run -> files -------------------------------------------------------

def bench_workload(workload: Workload, source: PromptSource, options: BenchOptions, slo: SloClass,
                   qps: float | None = None, num_requests: int | None = None, seed: int = 0,
                   model: str | None = None) -> BenchRun:
    """One open-loop run of the workload, arrivals cut at options.max_duration_s."""
    specs = generate(workload, qps, num_requests, options.max_duration_s, seed)
    return run_bench(specs, make_prompts(specs, source, options.sends_text), options, slo, model)


def live_probe(workload: Workload, source: PromptSource, options: BenchOptions, slo: SloClass,
               num_requests: int, seed: int = 0, min_duration_s: float = 0.0) -> Callable[[float], LatencySummary]:
    """A capacity probe: the same requests (same seed) replayed at a given qps against the server,
    at least `min_duration_s` of arrivals (loadgen.capacity.probe_size)."""
    model = resolve_model_name(options)
    return lambda qps: bench_workload(workload, source, options, slo, qps,
                                      probe_size(qps, num_requests, min_duration_s), seed, model).summary


def write_outputs(run: BenchRun, out_dir: str, extra: dict[str, Any] | None = None) -> list[str]:
    """bench.json (summary keys, settings and raw per-request data) and the PNG plots."""
    from loadgen.bench_plots import write_plots

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench.json")
    with open(path, "w") as f:
        json.dump({**(extra or {}), **run.as_dict()}, f, indent=2)
    raw = [r.as_dict(run.start) for r in run.results]
    return [path, *write_plots(raw, out_dir, run.summary.slo_ttft_s, run.summary.slo_tbt_s)]
