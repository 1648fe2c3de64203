"""The OpenAI-compatible HTTP API: handlers validate, enqueue on the engine loop, and stream.

The engine loads on a background thread after the server starts, so /health can say 503 until
the model is loaded and warm. Every error body has OpenAI's shape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.engine_loop import EngineLoop, ShedError
from engine.errors import EngineError, EngineFailed, InvalidRequestError
from engine.llm_engine import LLMEngine
from serving.openai_protocol import ChatCompletionRequest, CompletionRequest, SamplingFields, error_body
from serving.chat_plan import ChatParsers, ChatPlan, plan_chat
from serving.choices import Choice, kept, usage
from serving.logprobs_format import ReplyLogprobs
from serving.request_fields import note_ignored
from serving.tokenize_api import add_tokenize_routes
from engine.outputs import RequestOutput
from engine.scheduling.admission import SHED_EXPIRED, SHED_PREDICTED, SHED_QUEUE_FULL
from engine.scheduling.request import FinishReason, Request
from engine.slo_class import SloClass, SloClasses, shipped_slo_classes
from engine.structured.constraint import Constraint
from engine.structured.grammar_compiler import CompiledConstraint

log = logging.getLogger(__name__)


@dataclass
class ApiConfig:
    served_model_name: str
    max_waiting: int = 256                  # requests queued beyond this get 429
    max_body_bytes: int = 1 << 20
    default_max_tokens: int = 256
    retry_after_s: int = 1
    api_key: str | None = None              # required on /admin whenever set
    slo_classes: SloClasses = field(default_factory=shipped_slo_classes)   # what `slo_class` may name
    engine_stall_s: float | None = 600.0    # a step running longer is the engine's death (None: never)
    chat_parsers: ChatParsers = field(default_factory=ChatParsers)   # reasoning and tool-call formats


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.param, self.code, self.headers = status, type_, param, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(str(self), self.type, self.param, self.code), self.status, self.headers)


class ServerState:
    """What the handlers share: the engine loop once it is ready."""

    def __init__(self, config: ApiConfig, load_engine: Callable[[], LLMEngine]) -> None:
        self.config = config
        self._load_engine = load_engine
        self.loop: EngineLoop | None = None
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.draining = False

    def start_loading(self) -> threading.Thread:
        thread = threading.Thread(target=self._load, name="engine-load", daemon=True)
        thread.start()
        return thread

    def _load(self) -> None:
        try:
            engine = self._load_engine()
            loop = EngineLoop(engine, self.config.max_waiting, self.config.engine_stall_s)
            loop.start()
            self.loop = loop
            self.ready.set()
        except Exception as e:
            # the one-line reason is what the daemon exits with (http_server.serve); the traceback is for debugging
            log.debug("the engine failed to load", exc_info=True)
            self.load_error = one_line_reason(e)

    @property
    def engine_failure(self) -> str | None:
        """Why the engine loop died (the process is exiting), or None."""
        return self.loop.failure if self.loop is not None else None

    def require_loop(self) -> EngineLoop:
        if self.engine_failure:
            raise engine_failed(self.engine_failure)
        if self.draining:
            raise ApiError(503, "the server is shutting down", "service_unavailable", code="shutting_down")
        if self.loop is None:
            message = f"the model failed to load: {self.load_error}" if self.load_error else "the model is loading"
            raise ApiError(503, message, "service_unavailable", code="not_ready", headers={"Retry-After": "5"})
        return self.loop


def engine_failed(reason: str) -> ApiError:
    return ApiError(503, f"the engine failed ({reason}); the server is restarting", "service_unavailable",
                    code="engine_failed", headers={"Retry-After": "5"})


def one_line_reason(e: Exception) -> str:
    """An exception as one line: the engine's own errors speak for themselves, others name their type."""
    text = str(e) if isinstance(e, EngineError) else f"{type(e).__name__}: {e}"
    return " ".join(text.split())


def build_app(state: ServerState, extra_routes: Callable[[FastAPI, ServerState], None] | None = None) -> FastAPI:
    app = FastAPI(title="autotuned-serve", version="0.1.0")
    app.add_middleware(BodySizeLimit, max_bytes=state.config.max_body_bytes)
    _install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.engine_failure:
            return JSONResponse({"status": "failed", "error": state.engine_failure}, 503)
        if state.ready.is_set() and not state.draining:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "draining" if state.draining else "loading", "error": state.load_error}, 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.config.served_model_name, "object": "model",
                                            "created": 0, "owned_by": "autotuned-serve"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: HttpRequest):
        loop = state.require_loop()
        prompts = body.prompts()
        grammar = await _compiled(loop, body.constraint())
        groups = [loop.engine.fork(_make_request(state, loop, body, prompt, http, grammar), body.candidates)
                  for prompt in prompts]
        return await _respond(http, loop, groups, prompts, body, state.config.served_model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: HttpRequest):
        loop = state.require_loop()
        try:
            plan = plan_chat(body, loop.engine.tokenizer, state.config.chat_parsers)
        except InvalidRequestError:
            raise
        except Exception as e:   # a template's own error (TypeError, ...) on this conversation
            raise ApiError(400, f"cannot apply the chat template: {type(e).__name__}: {e}", param="messages") from e
        grammar = await _compiled(loop, plan.constraint)
        group = loop.engine.fork(_make_request(state, loop, body, plan.prompt, http, grammar), body.candidates)
        return await _respond(http, loop, [group], [plan.prompt], body, state.config.served_model_name, chat=True,
                              plan=plan)

    add_tokenize_routes(app, state)          # POST /tokenize, /detokenize (serving/tokenize_api.py)
    if extra_routes:
        extra_routes(app, state)
    return app


async def _compiled(loop: EngineLoop, constraint: Constraint | None) -> CompiledConstraint | None:
    """The output constraint compiled on the grammar worker (a cached one at once), or None."""
    return None if constraint is None else await loop.engine.grammars.compile_async(constraint)


def _make_request(state: ServerState, loop: EngineLoop, body: SamplingFields, prompt: str | list[int],
                  http: HttpRequest, grammar: CompiledConstraint | None = None) -> Request:
    name = state.config.served_model_name
    if body.model is not None and body.model != name:
        raise ApiError(400, f"model {body.model!r} is not served here; this server serves {name!r}", param="model",
                       code="model_not_found")
    slo = _slo_class(state.config.slo_classes, body, http)
    note_ignored(body.ignored_fields, loop.engine)   # fields with no effect: logged once, counted
    try:
        params = body.sampling_params(state.config.default_max_tokens)
        if body.candidates > body.n and params.logprobs is None:   # best_of ranks by cumulative logprob
            params = replace(params, logprobs=0)
        max_len = loop.engine.max_model_len
        if body.max_tokens is None:   # like OpenAI: the default shrinks to what the context allows
            prompt_len = len(prompt) if isinstance(prompt, list) else len(loop.engine.tokenizer.encode(prompt))
            if 0 < prompt_len < max_len and params.max_tokens > max_len - prompt_len:
                params = body.model_copy(update={"max_tokens": max_len - prompt_len}).sampling_params(0)
        return loop.engine.make_request(prompt, params, f"cmpl-{uuid.uuid4().hex}", slo=slo,
                                        cache_salt=_cache_salt(body, http), grammar=grammar)
    except InvalidRequestError as e:
        raise ApiError(400, str(e), param=e.param) from e


def _cache_salt(body: SamplingFields, http: HttpRequest) -> str | None:
    """The body's `cache_salt` within the API key's tenant (serving/auth.py): no tenant reaches another's blocks."""
    tenant = getattr(http.state, "tenant", None)
    return tenant.cache_salt(body.cache_salt) if tenant is not None else body.cache_salt


def _slo_class(classes: SloClasses, body: SamplingFields, http: HttpRequest) -> SloClass:
    """The body's `slo_class` (the openai client's extra_body), else the X-SLO-Class header, else the API key's
    (serving/auth.py), else the default."""
    tenant = getattr(http.state, "tenant", None)
    default = tenant.slo_class if tenant is not None else None
    name = body.slo_class if body.slo_class is not None else http.headers.get("x-slo-class", default)
    try:
        return classes.get(name)
    except ValueError as e:
        raise ApiError(400, str(e), param="slo_class", code="unknown_slo_class") from e


async def _outputs(http: HttpRequest, loop: EngineLoop, requests: list[Request]
                   ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Each request's outputs as they come, with its position in `requests`; aborts the unfinished ones if
    the client goes away first (or a later one cannot be queued: then 429 for the lot)."""
    aloop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
    unfinished: set[int] = set()
    try:
        for i, request in enumerate(requests):
            loop.submit(request, lambda out, i=i: aloop.call_soon_threadsafe(queue.put_nowait, (i, out)))
            unfinished.add(i)
        while unfinished:
            try:
                i, out = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                if await http.is_disconnected():
                    return
                continue
            if out.finished:
                unfinished.discard(i)
            if out.finish_reason == FinishReason.SHED.value:
                raise _expired(loop, requests[i])
            yield i, out
    except ShedError as e:
        raise _shed(str(e), SHED_CODES[e.reason], e.retry_after_s) from e
    except EngineFailed as e:
        raise engine_failed(str(e)) from e
    finally:
        for i in unfinished:
            loop.abort(requests[i].request_id)


SHED_CODES = {SHED_PREDICTED: "overloaded", SHED_QUEUE_FULL: "queue_full", SHED_EXPIRED: "deadline_expired"}


def _shed(message: str, code: str, retry_after_s: float) -> ApiError:
    """429 with Retry-After in whole seconds (at least 1), the time admission predicts the queue needs."""
    return ApiError(429, message, "rate_limit_error", code=code,
                    headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})


def _expired(loop: EngineLoop, request: Request) -> ApiError:
    scheduler = loop.engine.scheduler
    retry = scheduler.admission.retry_after(request, scheduler, time.monotonic())
    return _shed(f"the request waited past its {request.slo.name} class's {request.slo.ttft_s:g} s time-to-first-"
                 f"token target before it could start; retry later or elsewhere", "deadline_expired", retry)


async def _respond(http: HttpRequest, loop: EngineLoop, groups: list[list[Request]], prompts: list, body: SamplingFields,
                   model: str, chat: bool, plan: ChatPlan | None = None):
    """The reply to `groups` (per prompt, its candidates: n, or best_of), whole or streamed; a chat reply
    parsed as `plan` says (reasoning, tool calls)."""
    tokenizer = loop.engine.tokenizer
    shaped = plan is not None and plan.shapes_reply
    choices = [Choice(p * body.n + j, p, r,
                      ReplyLogprobs(tokenizer, r, chat, _echo_text(body, prompts[p], r, loop, chat), body.wants_logprobs),
                      shaper=plan.streamer(r.request_id) if shaped else None)
               for p, group in enumerate(groups) for j, r in enumerate(group)]
    outputs = _outputs(http, loop, [c.request for c in choices])
    first = await anext(outputs)          # raises 429 here, before any byte is sent
    reply_id = groups[0][0].request_id
    if body.stream:
        return StreamingResponse(_sse(first, outputs, reply_id, body, model, chat, choices, loop),
                                 media_type="text/event-stream")
    out: tuple[int, RequestOutput] | None = first
    while out is not None:
        choices[out[0]].add(out[1])
        out = await anext(outputs, None)
    if any(c.last is None or c.last.finish_reason == "error" for c in choices):
        raise ApiError(500, "generation failed for this request", "server_error", code="internal_error")
    response = {"id": reply_id, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": model,
                "choices": [_whole_choice(c, chat, loop) for c in kept(choices, body.n)], "usage": usage(choices)}
    if chat and choices[0].request.scores_prompt:     # vLLM's extension: per reply for chat, per choice otherwise
        response["prompt_logprobs"] = choices[0].reply.prompt_logprobs
    return response


def _whole_choice(c: Choice, chat: bool, loop: EngineLoop) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": c.index, "finish_reason": c.last.finish_reason, "logprobs": c.reply.take()}
    if chat and c.shaper is not None:
        first, last = c.shaper.feed(c.last.text), c.shaper.finish()
        _count_malformed(loop, c)
        reasoning, content, calls = first.reasoning + last.reasoning, first.content + last.content, c.shaper.calls
        choice["message"] = {"role": "assistant", "content": content or None, "reasoning_content": reasoning or None,
                             **({"tool_calls": [call.to_openai() for call in calls]} if calls else {})}
        if calls and c.last.finish_reason == "stop":
            choice["finish_reason"] = "tool_calls"
    elif chat:
        choice["message"] = {"role": "assistant", "content": c.last.text}
    else:
        choice["text"] = c.reply.echo + c.last.text
        if c.request.scores_prompt:
            choice["prompt_logprobs"] = c.reply.prompt_logprobs
    return choice


def _echo_text(body: SamplingFields, prompt: str | list[int], request: Request, loop: EngineLoop, chat: bool) -> str:
    """The prompt, which a completions reply with `echo` repeats before its text ("" otherwise)."""
    if chat or not getattr(body, "echo", False):
        return ""
    return prompt if isinstance(prompt, str) else loop.engine.tokenizer.decode(request.prompt_token_ids)


async def _sse(first: tuple[int, RequestOutput], rest: AsyncIterator[tuple[int, RequestOutput]], reply_id: str,
               body: SamplingFields, model: str, chat: bool, choices: list[Choice],
               loop: EngineLoop) -> AsyncIterator[str]:
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(parts: list[dict[str, Any]], usage_: dict[str, Any] | None = None) -> str:
        data: dict[str, Any] = {"id": reply_id, "object": kind, "created": created, "model": model, "choices": parts}
        if body.include_usage:
            data["usage"] = usage_
        return f"data: {json.dumps(data)}\n\n"

    try:
        async for line in _sse_lines(first, rest, chunk, chat, body.include_usage, choices, loop):
            yield line
    finally:  # a client that went away closes us; close the output stream so it aborts the requests
        await rest.aclose()
    yield "data: [DONE]\n\n"


async def _sse_lines(first: tuple[int, RequestOutput], rest: AsyncIterator[tuple[int, RequestOutput]],
                     chunk: Callable[..., str], chat: bool, include_usage: bool,
                     choices: list[Choice], loop: EngineLoop) -> AsyncIterator[str]:
    item: tuple[int, RequestOutput] | None = first
    while item is not None:
        c, out = choices[item[0]], item[1]
        if out.finish_reason == "error":
            yield f"data: {json.dumps(error_body('generation failed for this request', 'server_error'))}\n\n"
            break
        c.add(out)
        opening = c.opens()
        if chat and opening:
            yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if c.shaper is not None:
            part = _shaped_part(c, out)
            if out.finished:
                _count_malformed(loop, c)
            if part is not None:
                yield chunk([part])
            item = await anext(rest, None)
            continue
        prefix = c.reply.echo if opening else ""     # a completion with echo streams its prompt first
        if out.text_delta or out.finished or prefix:
            text = prefix + out.text_delta
            payload = {"delta": {"content": text} if text else {}} if chat else {"text": text}
            part = {"index": c.index, **payload, "logprobs": c.reply.take(), "finish_reason": out.finish_reason}
            if opening and c.request.scores_prompt:     # vLLM's extension, once, with the first chunk
                part["prompt_logprobs"] = c.reply.prompt_logprobs
            yield chunk([part])
        item = await anext(rest, None)
    if include_usage:
        yield chunk([], usage(choices))


def _shaped_part(c: Choice, out: RequestOutput) -> dict[str, Any] | None:
    """A chat chunk's choice with the reasoning, content and tool-call deltas this output gives (None:
    nothing to send yet, text held back while it may open a call or close the reasoning)."""
    d = c.shaper.feed(out.text_delta)
    if out.finished:
        last = c.shaper.finish()
        d.reasoning, d.content, d.tool_calls = d.reasoning + last.reasoning, d.content + last.content, \
            d.tool_calls + last.tool_calls
    delta: dict[str, Any] = {}
    if d.reasoning:
        delta["reasoning_content"] = d.reasoning
    if d.content:
        delta["content"] = d.content
    if d.tool_calls:
        delta["tool_calls"] = d.tool_calls
        c.made_calls = True
    if not delta and not out.finished:
        return None
    reason = out.finish_reason
    if out.finished and c.made_calls and reason == "stop":
        reason = "tool_calls"
    return {"index": c.index, "delta": delta, "logprobs": c.reply.take(), "finish_reason": reason}


def _count_malformed(loop: EngineLoop, c: Choice) -> None:
    """Tool-call markers whose call did not parse, into the metrics (PrometheusMetrics.count_tool_call_failure)."""
    if not c.shaper.malformed or c.shaper.tools is None:
        return
    for listener in loop.engine.arrival_listeners:
        count = getattr(getattr(listener, "__self__", None), "count_tool_call_failure", None)
        if callable(count):
            count(c.shaper.format_name, c.shaper.malformed)
            return


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: HttpRequest, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(InvalidRequestError)
    async def invalid_request(_: HttpRequest, e: InvalidRequestError) -> JSONResponse:
        return JSONResponse(error_body(str(e), param=e.param), 400)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: HttpRequest, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = "the request body is not valid JSON"
        return JSONResponse(error_body(f"{message}" + (f" (at {where})" if where else ""), param=where), 400)

    @app.exception_handler(ValidationError)
    async def model_error(_: HttpRequest, e: ValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(e.errors()[0].get("msg"))), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: HttpRequest, e: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), type_), e.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_: HttpRequest, e: Exception) -> JSONResponse:
        log.exception("unhandled error in a request handler")
        return JSONResponse(error_body("internal server error", "server_error"), 500)


class BodySizeLimit:
    """413 for bodies over the limit, counted as they arrive (Content-Length may be absent)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._reject(send)

    async def _reject(self, send) -> None:
        body = json.dumps(error_body(f"request body larger than {self.max_bytes} bytes",
                                     code="request_too_large")).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
