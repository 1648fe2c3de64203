"""Hermes-style calls, one JSON object per `<tool_call>` block (Qwen 2.5, Qwen 3, NousResearch Hermes):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls are several blocks (Qwen's templates put a newline between them). In Qwen 2.5's
tokenizer `<tool_call>` and `</tool_call>` are added tokens that are not special (user-defined in its
GGUF files), so a detokenizer that skips special tokens keeps them."""

from __future__ import annotations

from typing import Any

from serving.tool_calls import grammar
from serving.tool_calls.format import MarkerFormat, delimited
from serving.tool_calls.json_object import CallSpec, calls_between
from serving.tool_calls.scanner import Region

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = CallSpec(args_keys=("arguments",))


class HermesFormat(MarkerFormat):
    name = "hermes"
    markers = (OPEN,)

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        span = delimited(text, start, OPEN, CLOSE, final)
        if span is None:
            return None
        body, body_end, end = span
        calls = calls_between(text, body, body_end, _CALL, several=False)
        return Region(end, calls) if calls else Region(end, malformed=True)

    def structural_tag(self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any],
                       parallel_tool_calls: bool) -> dict[str, Any] | None:
        choice = grammar.choice_of(tools, tool_choice, parallel_tool_calls)
        if choice is None:
            return None
        if choice.mode != "auto":
            return grammar.calls_anywhere(choice, OPEN, _call_tag, "\n")
        return grammar.builtin("qwen_3", choice)     # xgrammar's writes these blocks exactly


def _call_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f'{OPEN}\n{{"name": "{function.name}", "arguments": ', function, f"}}\n{CLOSE}")
