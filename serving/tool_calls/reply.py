"""A reply as the chat API returns it: reasoning split off first, then calls parsed from the content
only (a call drafted inside the reasoning is not a call), whole or streamed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving.reasoning_parser import ReasoningParser, ReasoningStreamer
from serving.tool_calls.call import CallId, ParsedReply, ToolCall
from serving.tool_calls.format import ToolCallFormat
from serving.tool_calls.streaming import ToolCallStreamer


@dataclass
class ReplyDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ReplyStreamer:
    """Either part may be absent: no reasoning parser (the model does not reason, or not this time),
    no format (the request has no tools, or tool_choice "none")."""

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallFormat | None, call_id: CallId) -> None:
        self._reasoning: ReasoningStreamer | None = reasoning.streamer() if reasoning else None
        self.tools: ToolCallStreamer | None = tools.streamer(call_id) if tools else None
        self.format_name = tools.name if tools else None

    def feed(self, text_delta: str) -> ReplyDelta:
        reasoning, content = self._reasoning.feed(text_delta) if self._reasoning else ("", text_delta)
        return self._content(reasoning, content, final=False)

    def finish(self) -> ReplyDelta:
        reasoning, content = self._reasoning.finish() if self._reasoning else ("", "")
        return self._content(reasoning, content, final=True)

    @property
    def malformed(self) -> int:
        return self.tools.malformed if self.tools else 0

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        """The calls found so far."""
        return tuple(self.tools.calls) if self.tools else ()

    def _content(self, reasoning: str, content: str, final: bool) -> ReplyDelta:
        if self.tools is None:
            return ReplyDelta(reasoning, content)
        delta = self.tools.feed(content)
        if not final:
            return ReplyDelta(reasoning, delta.content, delta.tool_calls)
        last = self.tools.finish()
        return ReplyDelta(reasoning, delta.content + last.content, delta.tool_calls + last.tool_calls)


def parse_reply(text: str, reasoning: ReasoningParser | None, tools: ToolCallFormat | None,
                call_id: CallId) -> tuple[str | None, ParsedReply]:
    """(reasoning or None, the content and calls) of a whole reply."""
    streamer = ReplyStreamer(reasoning, tools, call_id)
    first, last = streamer.feed(text), streamer.finish()
    content = first.content + last.content
    calls = tuple(streamer.tools.calls) if streamer.tools else ()
    return (first.reasoning + last.reasoning) or None, ParsedReply(content or None, calls, streamer.malformed)
