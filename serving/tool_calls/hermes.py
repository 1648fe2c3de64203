"""Hermes-style calls, one JSON object per `<tool_call>` block (Qwen 2.5, Qwen 3, NousResearch Hermes):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Several calls are several blocks (Qwen's templates put a newline between them). A reply that opens with
the bare call object, no block around it, or with it in a Markdown code fence (what the small
Qwen2.5-Coder models write under their tool prompt), is that call: only at the start, where no prose can
hold a `{`. In Qwen 2.5's
tokenizer `<tool_call>` and `</tool_call>` are added tokens that are not special (user-defined in its
GGUF files), so a detokenizer that skips special tokens keeps them."""

from __future__ import annotations

import re
from typing import Any

from serving.tool_calls import grammar
from serving.tool_calls.format import MarkerFormat, block_region
from serving.tool_calls.json_object import CallSpec, call_of, opens_name, read_object, skip_ws
from serving.tool_calls.scanner import Region

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FENCE = "```"
_FENCE_OPENER = re.compile(r"```(?:json)?[ \t]*\n[ \t]*")
_CALL = CallSpec(args_keys=("arguments",))


class HermesFormat(MarkerFormat):
    name = "hermes"
    markers = (OPEN, FENCE, "{")

    def __init__(self, bare_calls: bool = True) -> None:
        self.bare_calls = bare_calls      # False once a stream has sent text: a `{` can no longer open the reply

    @property
    def after_start(self) -> HermesFormat:
        """The reader for the rest of a stream that has begun."""
        return HermesFormat(bare_calls=False)

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        if text.startswith(FENCE, start):
            return _fenced_call(text, start, final) if self.bare_calls else Region(start + len(FENCE))
        if not text.startswith(OPEN, start):
            return _bare_call(text, start, final) if self.bare_calls else Region(start + 1)
        return block_region(text, start, OPEN, CLOSE, final, _CALL, several=False)

    def grammar_for(self, choice: grammar.Choice) -> dict[str, Any]:
        if choice.mode != "auto":
            return grammar.calls_anywhere(choice, OPEN, _call_tag, "\n")
        return grammar.builtin("qwen_3", choice)     # xgrammar's writes these blocks exactly


def _bare_call(text: str, start: int, final: bool, opening: int = 0) -> Region | None:
    """The `{` at text[start]: a call where it opens the reply (after text[:opening], a fence) with a complete
    call object, else text (a JSON answer that is not a call is an answer, not a malformed call)."""
    if text[opening:start].strip() or (opening == 0 and text[:start].strip()):
        return Region(start + 1)
    head = opens_name(text, start)
    if not head:
        return Region(start + 1) if head is False or final else None
    try:
        members, end = read_object(text, start)
    except ValueError:          # not closed yet, or not JSON: only the end of the reply tells which
        return Region(start + 1) if final else None
    call = call_of(text, members, _CALL)
    return Region(end, (call,)) if call else Region(start + 1)


def _fenced_call(text: str, start: int, final: bool) -> Region | None:
    """A reply that opens with ```json, a call object and ``` is that call; any other fence is text."""
    if text[:start].strip():
        return Region(start + len(FENCE))
    opener = _FENCE_OPENER.match(text, start)
    if opener is None:
        undecided = not final and len(text) - start < len("```json\n") and "```json\n".startswith(text[start:])
        return None if undecided else Region(start + len(FENCE))
    inner = _bare_call(text, opener.end(), final, opener.end())
    if inner is None or not inner.calls:
        return inner if inner is None else Region(start + len(FENCE))
    after = skip_ws(text, inner.end)
    if text.startswith(FENCE, after):
        return Region(after + len(FENCE), inner.calls)
    if not final and len(text) - after < len(FENCE) and FENCE.startswith(text[after:]):
        return None          # the closing fence may be coming
    return Region(inner.end, inner.calls)


def _call_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f'{OPEN}\n{{"name": "{function.name}", "arguments": ', function, f"}}\n{CLOSE}")
