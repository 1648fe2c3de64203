"""JSON objects read with the span of each member's value, so that a call's arguments are returned as the
model wrote them (re-serializing would change spacing, key order and escapes, and a streamed reply could
no longer agree with the same reply parsed whole)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.decoder import scanstring
from typing import Any

_DECODER = json.JSONDecoder()
WHITESPACE = " \t\n\r"


@dataclass(frozen=True)
class Member:
    key: str
    value: Any
    start: int      # the value's span in the text
    end: int


@dataclass(frozen=True)
class CallSpec:
    """What a format's call object holds: the name's key, the arguments' keys (one of them), other keys
    it may carry (ignored)."""

    args_keys: tuple[str, ...] = ("arguments",)
    extra_keys: tuple[str, ...] = ()
    name_key: str = "name"


NAME_KEY = '"name"'


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def read_object(text: str, i: int) -> tuple[list[Member], int]:
    """The members of the JSON object starting at text[i] and the index after its '}'; ValueError where
    there is no complete, valid object there."""
    if text[i:i + 1] != "{":
        raise ValueError("expected an object")
    members: list[Member] = []
    i = skip_ws(text, i + 1)
    if text[i:i + 1] == "}":
        return members, i + 1
    while True:
        if text[i:i + 1] != '"':
            raise ValueError("expected a key")
        key, i = scanstring(text, i + 1)
        i = skip_ws(text, i)
        if text[i:i + 1] != ":":
            raise ValueError("expected ':'")
        start = skip_ws(text, i + 1)
        value, end = _DECODER.raw_decode(text, start)
        members.append(Member(key, value, start, end))
        i = skip_ws(text, end)
        if text[i:i + 1] == "}":
            return members, i + 1
        if text[i:i + 1] != ",":
            raise ValueError("expected ',' or '}'")
        i = skip_ws(text, i + 1)


def read_array(text: str, i: int) -> tuple[list[list[Member]], int]:
    """The objects of the JSON array of objects starting at text[i], and the index after its ']'."""
    if text[i:i + 1] != "[":
        raise ValueError("expected an array")
    items: list[list[Member]] = []
    i = skip_ws(text, i + 1)
    if text[i:i + 1] == "]":
        return items, i + 1
    while True:
        members, i = read_object(text, i)
        items.append(members)
        i = skip_ws(text, i)
        if text[i:i + 1] == "]":
            return items, i + 1
        if text[i:i + 1] != ",":
            raise ValueError("expected ',' or ']'")
        i = skip_ws(text, i + 1)


def call_of(text: str, members: list[Member], spec: CallSpec) -> tuple[str, str] | None:
    """(name, arguments) of a call object, or None where it is not one: the name missing or not a
    non-empty string, no arguments or two kinds of them, a key the format does not know, a key twice."""
    keys = [m.key for m in members]
    allowed = {spec.name_key, *spec.args_keys, *spec.extra_keys}
    if len(set(keys)) != len(keys) or not set(keys) <= allowed:
        return None
    by_key = {m.key: m for m in members}
    name = by_key.get(spec.name_key)
    args = [by_key[k] for k in spec.args_keys if k in by_key]
    if name is None or not isinstance(name.value, str) or not name.value or len(args) != 1:
        return None
    arguments = arguments_text(text, args[0])
    return None if arguments is None else (name.value, arguments)


def read_arguments(text: str, i: int) -> tuple[str | None, int]:
    """The arguments (as `arguments_text`) of the JSON value at text[i], None where they are not an
    object, and the index after the value; ValueError where there is no complete value."""
    value, end = _DECODER.raw_decode(text, i)
    return arguments_text(text, Member("", value, i, end)), end


def arguments_text(text: str, member: Member) -> str | None:
    """The arguments object's text; a string holding an object's JSON (some models quote the arguments,
    as their templates render a history's string arguments) is that JSON."""
    if isinstance(member.value, dict):
        return text[member.start:member.end]
    if isinstance(member.value, str):
        try:
            inner = json.loads(member.value)
        except ValueError:
            return None
        return member.value if isinstance(inner, dict) else None
    return None


def calls_between(text: str, start: int, stop: int, spec: CallSpec, several: bool) -> tuple[tuple[str, str], ...] | None:
    """The calls text[start:stop] holds, whitespace around them: one call object, or with `several` an
    array of them or objects separated by commas; None where it holds anything else."""
    bounded = text[:stop]       # a call may not run past its end marker
    i = skip_ws(bounded, start)
    try:
        if several and bounded[i:i + 1] == "[":
            objects, i = read_array(bounded, i)
        else:
            objects, i = _objects(bounded, i, several)
    except ValueError:
        return None
    calls = [call_of(bounded, members, spec) for members in objects]
    if skip_ws(bounded, i) != stop or not calls or None in calls:
        return None
    return tuple(call for call in calls if call is not None)


def _objects(text: str, i: int, several: bool) -> tuple[list[list[Member]], int]:
    objects: list[list[Member]] = []
    while True:
        members, i = read_object(text, i)
        objects.append(members)
        after = skip_ws(text, i)
        if not several or text[after:after + 1] != ",":
            return objects, i
        i = skip_ws(text, after + 1)


def opens_name(text: str, i: int) -> bool | None:
    """Whether text[i:] opens `{"name":` (whitespace allowed); None where the text ends before it tells."""
    j = skip_ws(text, i + 1)
    key = text[j:j + len(NAME_KEY)]
    if key != NAME_KEY:
        return None if len(key) < len(NAME_KEY) and NAME_KEY.startswith(key) else False
    j = skip_ws(text, j + len(NAME_KEY))
    return None if j == len(text) else text[j] == ":"
