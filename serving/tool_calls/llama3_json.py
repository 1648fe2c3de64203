"""Llama 3.x JSON calls: the reply is a JSON object naming the function, its arguments under
"parameters" (as Llama 3.1-3.3's templates ask; "arguments" is read too), several separated by `;`:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

Llama 3.1 may first write `<|python_tag|>` (a special token: a detokenizer that skips special tokens
drops it, and the call is still found). There is no end marker: a call ends where its JSON object
closes. Any `{` that opens `{"name":` starts a call; a complete object that is not one is malformed
and stays content."""

from __future__ import annotations

from typing import Any

from serving.tool_calls import grammar
from serving.tool_calls.format import MarkerFormat
from serving.tool_calls.json_object import CallSpec, call_of, opens_name, read_object, skip_ws
from serving.tool_calls.scanner import Region

PYTHON_TAG = "<|python_tag|>"
_CALL = CallSpec(args_keys=("parameters", "arguments"))


class Llama3JsonFormat(MarkerFormat):
    name = "llama3_json"
    markers = (PYTHON_TAG, "{")
    separator = ";"

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        if not text.startswith(PYTHON_TAG, start):
            return _object_at(text, start, final)
        after = start + len(PYTHON_TAG)
        i = skip_ws(text, after)
        if i == len(text):
            return Region(i, malformed=True) if final else None
        region = _object_at(text, i, final) if text[i] == "{" else Region(i + 1)
        if region is None or region.calls or region.malformed:
            return region
        return Region(after, malformed=True)         # the tag is followed by no call

    def grammar_for(self, choice: grammar.Choice) -> dict[str, Any]:
        if choice.mode != "auto":
            return grammar.calls_anywhere(choice, '{"name": ', _call_tag, "; ")
        return grammar.builtin("llama", choice)       # xgrammar's writes these objects exactly


def _object_at(text: str, i: int, final: bool) -> Region | None:
    """The region of the `{` at text[i]: plain text unless it opens `{"name":`; then a call once the
    object closes, malformed where it does not."""
    head = opens_name(text, i)
    if head is None:
        return Region(i + 1) if final else None
    if not head:
        return Region(i + 1)
    try:
        members, end = read_object(text, i)
    except ValueError:      # not closed yet, or not JSON: only the end of the reply tells which
        return Region(len(text), malformed=True) if final else None
    call = call_of(text, members, _CALL)
    return Region(end, (call,)) if call else Region(end, malformed=True)


def _call_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f'{{"name": "{function.name}", "parameters": ', function, "}")
