"""OpenAI chat replies as the Berkeley Function Calling Leaderboard (BFCL) reads them, for
benchmarks/bfcl_check.py: a reply parsed from a message or assembled from streamed deltas, its tool
calls decoded into BFCL's format (a list of {func_name: {arg: value}}), the irrelevance rule, the
malformed-call count of `tool_choice: "required"` and the per-category summary.

Standard library only, so the tests run it in the project's venv without bfcl-eval installed.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


class DecodeError(ValueError):
    """A reply whose tool calls BFCL's FC decoder would fail on."""


class StreamError(ValueError):
    """Streamed deltas that do not assemble into one reply."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: Any          # the JSON text the server sent; anything else is a malformed call
    type: str = "function"


@dataclass
class Reply:
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None


def parse_message(choice: dict[str, Any]) -> Reply:
    """The reply in a non-streamed `choices[0]`."""
    message = choice.get("message") or {}
    calls = [ToolCall(id=c.get("id") or "", name=(c.get("function") or {}).get("name") or "",
                      arguments=(c.get("function") or {}).get("arguments"), type=c.get("type") or "")
             for c in message.get("tool_calls") or []]
    return Reply(content=message.get("content"), tool_calls=calls, finish_reason=choice.get("finish_reason"))


def sse_events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of a server-sent-events body's `data:` lines, up to `data: [DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def assemble_stream(chunks: Iterable[dict[str, Any]]) -> Reply:
    """One reply from `chat.completion.chunk`s, the way the openai client accumulates them: content
    fragments joined; each tool call keyed by its delta's `index`, its `id`, name and argument fragments
    joined in order, `type` taken as sent. An index missing or a gap in the indices is a StreamError."""
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish_reason = None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for part in delta.get("tool_calls") or []:
                _add_call_delta(calls, part)
            finish_reason = choice.get("finish_reason") or finish_reason
    if sorted(calls) != list(range(len(calls))):
        raise StreamError(f"tool call indices {sorted(calls)} are not 0..{len(calls) - 1}")
    return Reply(content="".join(content) if content else None,
                 tool_calls=[ToolCall(**calls[i]) for i in range(len(calls))], finish_reason=finish_reason)


def _add_call_delta(calls: dict[int, dict[str, str]], part: dict[str, Any]) -> None:
    index = part.get("index")
    if not isinstance(index, int):
        raise StreamError(f"a tool call delta without an integer index: {part}")
    call = calls.setdefault(index, {"id": "", "name": "", "arguments": "", "type": "function"})
    call["id"] += part.get("id") or ""
    call["type"] = part.get("type") or call["type"]
    function = part.get("function") or {}
    call["name"] += function.get("name") or ""
    call["arguments"] += function.get("arguments") or ""


def stream_differences(streamed: Reply, plain: Reply) -> list[str]:
    """How the assembled streamed reply differs from the non-streamed one (empty: identical). Call ids
    are drawn per request, so each side only has to give every call one."""
    diffs = []
    if (streamed.content or "") != (plain.content or ""):
        diffs.append(f"content {streamed.content!r} != {plain.content!r}")
    if streamed.finish_reason != plain.finish_reason:
        diffs.append(f"finish_reason {streamed.finish_reason!r} != {plain.finish_reason!r}")
    if len(streamed.tool_calls) != len(plain.tool_calls):
        diffs.append(f"{len(streamed.tool_calls)} tool calls != {len(plain.tool_calls)}")
    for i, (s, p) in enumerate(zip(streamed.tool_calls, plain.tool_calls)):
        for key in ("name", "arguments", "type"):
            if getattr(s, key) != getattr(p, key):
                diffs.append(f"call {i} {key} {getattr(s, key)!r} != {getattr(p, key)!r}")
        if not s.id or not p.id:
            diffs.append(f"call {i} has no id (streamed {s.id!r}, non-streamed {p.id!r})")
    return diffs


def decode_calls(reply: Reply) -> list[dict[str, Any]]:
    """BFCL's OpenAI FC decoding: [{name: json.loads(arguments)}] per tool call. A reply without tool
    calls reaches BFCL's decoder as its text and fails there, so it is a DecodeError here too."""
    if not reply.tool_calls:
        raise DecodeError("no tool call in the reply")
    decoded = []
    for call in reply.tool_calls:
        if not isinstance(call.arguments, str):
            raise DecodeError(f"arguments of {call.name!r} are not JSON text: {call.arguments!r}")
        try:
            decoded.append({call.name: json.loads(call.arguments)})
        except json.JSONDecodeError as e:
            raise DecodeError(f"arguments of {call.name!r} are not JSON: {e}") from e
    return decoded


def text_calls(content: str | None) -> list[ToolCall]:
    """Calls written into the text instead of `tool_calls`: each JSON object {"name": str, "arguments":
    object} found in it (bare, in a code fence or in <tool_call> tags), or each such object of a JSON
    list. Not BFCL's score: a diagnostic that separates what the model meant from what the server's
    tool-call parser returned."""
    found: list[ToolCall] = []
    decoder, text, pos = json.JSONDecoder(), content or "", 0
    while (pos := _next_json_start(text, pos)) >= 0:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            pos += 1
            continue
        found += [ToolCall(id=f"text-{len(found) + i}", name=v["name"], arguments=json.dumps(v["arguments"]))
                  for i, v in enumerate(value if isinstance(value, list) else [value]) if _is_written_call(v)]
        pos = end
    return found


def _next_json_start(text: str, pos: int) -> int:
    starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
    return min(starts) if starts else -1


def _is_written_call(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments"), dict))


def is_function_calling_format(decoded: Any) -> bool:
    """BFCL's is_function_calling_format_output: a list of one-key dicts whose value is a dict."""
    return isinstance(decoded, list) and all(
        isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict)
        for item in decoded)


def made_call(reply: Reply) -> bool:
    """BFCL's relevance rule: the reply calls a function when its tool calls decode into a non-empty
    function-calling list. An irrelevance case is correct when this is False (so a call whose
    arguments are not JSON counts as no call there, as in BFCL)."""
    try:
        decoded = decode_calls(reply)
    except DecodeError:
        return False
    return is_function_calling_format(decoded) and bool(decoded) and decoded != [{}]


def malformed_reasons(reply: Reply, declared: set[str]) -> list[str]:
    """Why a reply to `tool_choice: "required"` is malformed: "no_call", "bad_json" (arguments that are
    not a JSON object) or "undeclared_name", one entry per offending call; empty when well formed."""
    if not reply.tool_calls:
        return ["no_call"]
    reasons = []
    for call in reply.tool_calls:
        if call.name not in declared:
            reasons.append("undeclared_name")
        try:
            if not isinstance(call.arguments, str) or not isinstance(json.loads(call.arguments), dict):
                reasons.append("bad_json")
        except json.JSONDecodeError:
            reasons.append("bad_json")
    return reasons


@dataclass
class CaseResult:
    id: str
    category: str
    valid: bool
    latency_s: float
    calls: list[dict[str, Any]] | None = None       # the decoded calls; None when they did not decode
    error: Any = None                               # the checker's (or decoder's, or HTTP) error
    error_type: str | None = None
    tool_calls: int = 0                             # how many tool calls the reply had
    text_calls: int = 0                             # calls written into its text (text_calls)
    text_valid: bool = False                        # the verdict with those read as its calls
    content: str | None = None
    finish_reason: str | None = None


def summarize(results: list[CaseResult]) -> dict[str, dict[str, Any]]:
    """Per category: cases, correct, accuracy, HTTP errors, replies without a tool call, latency."""
    out: dict[str, dict[str, Any]] = {}
    for category in dict.fromkeys(r.category for r in results):
        rows = [r for r in results if r.category == category]
        correct = sum(r.valid for r in rows)
        latencies = [r.latency_s for r in rows if r.error_type != "http_error"]
        out[category] = {
            "cases": len(rows), "correct": correct, "accuracy": correct / len(rows),
            "http_errors": sum(r.error_type == "http_error" for r in rows),
            "no_tool_call": sum(r.tool_calls == 0 and r.error_type != "http_error" for r in rows),
            "text_call_replies": sum(r.tool_calls == 0 and r.text_calls > 0 for r in rows),
            "text_call_accuracy": sum(r.text_valid for r in rows) / len(rows),
            "latency_s_mean": statistics.fmean(latencies) if latencies else None,
            "latency_s_median": statistics.median(latencies) if latencies else None,
        }
    return out
