"""Mistral's calls after `[TOOL_CALLS]`, in one of two forms:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]     (Mistral 7B v0.3, Nemo)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                                 (Mistral Small 3.2, ...)

(the second as its templates write history with `[CALL_ID]id` before `[ARGS]`, read here too; several
calls are several `[TOOL_CALLS]`). `[TOOL_CALLS]` and `[ARGS]` are special tokens of Mistral's
tokenizers: the text parsed must be detokenized with them kept. The form a model writes is its
template's (`format_for_template` reads it); both are parsed whatever the grammar's form."""

from __future__ import annotations

import re
from typing import Any, Literal

from serving.tool_calls import grammar
from serving.tool_calls.format import MarkerFormat
from serving.tool_calls.json_object import CallSpec, call_of, read_arguments, read_array, skip_ws
from serving.tool_calls.scanner import Region

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_CALL = CallSpec(args_keys=("arguments",), extra_keys=("id",))   # "id": as the Nemo template writes history
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_ID = re.compile(r"[A-Za-z0-9]+")


class MistralFormat(MarkerFormat):
    name = "mistral"
    markers = (TOOL_CALLS,)

    def __init__(self, call_form: Literal["array", "name_args"] = "array") -> None:
        self.call_form = call_form      # the form the grammar holds calls to

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        i = skip_ws(text, start + len(TOOL_CALLS))
        if i == len(text):
            return Region(i, malformed=True) if final else None
        if text[i] == "[":
            return _array(text, i, final)
        return _name_args(text, i, final)

    def grammar_for(self, choice: grammar.Choice) -> dict[str, Any]:
        if self.call_form == "name_args":
            return grammar.calls_anywhere(choice, TOOL_CALLS, _name_args_tag, "")
        return grammar.calls_in_block(choice, TOOL_CALLS, TOOL_CALLS + "[", "]", _object_tag, ", ")

    def __repr__(self) -> str:
        return f"<tool-call format mistral ({self.call_form})>"


def _array(text: str, i: int, final: bool) -> Region | None:
    try:
        items, end = read_array(text, i)
    except ValueError:      # not closed yet, or not JSON: only the end of the reply tells which
        return Region(len(text), malformed=True) if final else None
    calls = [call_of(text, members, _CALL) for members in items]
    if not calls or None in calls:
        return Region(end, malformed=True)
    return Region(end, tuple(call for call in calls if call is not None))


def _name_args(text: str, i: int, final: bool) -> Region | None:
    """name [CALL_ID]id? [ARGS] {...} from text[i]."""
    name = _NAME.match(text, i)
    if name is None:
        return Region(i, malformed=True)
    j = name.end()
    if text.startswith(CALL_ID, j):
        call_id = _ID.match(text, j + len(CALL_ID))
        j = call_id.end() if call_id else j + len(CALL_ID)
    if not text.startswith(ARGS, j):
        undecided = j == len(text) or ARGS.startswith(text[j:]) or CALL_ID.startswith(text[j:])
        if undecided and not final:
            return None
        return Region(len(text) if undecided else j, malformed=True)
    a = skip_ws(text, j + len(ARGS))
    if text[a:a + 1] not in ("{", '"', ""):
        return Region(a, malformed=True)
    try:
        arguments, end = read_arguments(text, a)
    except ValueError:
        return Region(len(text), malformed=True) if final else None
    return Region(end, ((name.group(), arguments),)) if arguments else Region(end, malformed=True)


def _object_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f'{{"name": "{function.name}", "arguments": ', function, "}")


def _name_args_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f"{TOOL_CALLS}{function.name}{ARGS}", function, "")
