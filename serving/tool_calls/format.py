"""What a tool-call format is to the server: a whole-reply parser, a streaming one and the grammar that
constrains generation to its calls. Each format (hermes.py, llama3_json.py, mistral.py, phi4_mini.py)
only says how a region at one of its markers reads; parsing and streaming are shared."""

from __future__ import annotations

from typing import Any, Protocol

from serving.tool_calls import grammar
from serving.tool_calls.call import CallId, ParsedReply
from serving.tool_calls.json_object import CallSpec, calls_between
from serving.tool_calls.scanner import Region
from serving.tool_calls.streaming import ToolCallStreamer, parse_text


class ToolCallFormat(Protocol):
    name: str

    def parse(self, text: str, call_id: CallId) -> ParsedReply: ...

    def streamer(self, call_id: CallId) -> ToolCallStreamer: ...

    def structural_tag(self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any],
                       parallel_tool_calls: bool) -> dict[str, Any] | None:
        """An xgrammar structural tag (JSON) constraining a reply to the choice; None for "none"."""
        ...


class MarkerFormat:
    """A format whose calls start at fixed markers; subclasses read the region at a marker."""

    name: str = ""
    markers: tuple[str, ...] = ()
    separator: str = ""

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        raise NotImplementedError

    def structural_tag(self, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any],
                       parallel_tool_calls: bool) -> dict[str, Any] | None:
        choice = grammar.choice_of(tools, tool_choice, parallel_tool_calls)
        return None if choice is None else self.grammar_for(choice)

    def grammar_for(self, choice: grammar.Choice) -> dict[str, Any]:
        """The structural tag holding a reply to `choice` in this format."""
        raise NotImplementedError

    def parse(self, text: str, call_id: CallId) -> ParsedReply:
        return parse_text(self, text, call_id)

    def streamer(self, call_id: CallId) -> ToolCallStreamer:
        return ToolCallStreamer(self, call_id)

    def __repr__(self) -> str:
        return f"<tool-call format {self.name}>"


def block_region(text: str, start: int, opener: str, closer: str, final: bool, spec: CallSpec,
                 several: bool) -> Region | None:
    """The region of an `opener` ... `closer` block holding the call (or, with `several`, the calls) of `spec`;
    malformed where its body holds anything else."""
    span = delimited(text, start, opener, closer, final)
    if span is None:
        return None
    body, body_end, end = span
    calls = calls_between(text, body, body_end, spec, several)
    return Region(end, calls) if calls else Region(end, malformed=True)


def delimited(text: str, start: int, opener: str, closer: str, final: bool) -> tuple[int, int, int] | None:
    """(body start, body end, region end) of `opener` ... `closer` at text[start]; a block the reply ends
    inside runs to the end (models often leave the last one open, its end being the end of turn)."""
    body = start + len(opener)
    close = text.find(closer, body)
    if close >= 0:
        return body, close, close + len(closer)
    return (body, len(text), len(text)) if final else None
