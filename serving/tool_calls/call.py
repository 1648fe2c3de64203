"""The values the tool-call parsers produce, in the shapes of OpenAI's Chat Completions API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

# index of a call in its reply -> the id it is given: the caller's, so that a streamed reply and the same
# reply parsed whole carry the same ids
CallId = Callable[[int], str]


@dataclass(frozen=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str      # the JSON text of the arguments object, as the model wrote it

    def to_openai(self) -> dict[str, Any]:
        """The call as a message's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def deltas(self) -> list[dict[str, Any]]:
        """The call as streamed `delta.tool_calls` entries: id and name first, then the arguments."""
        return [{"index": self.index, "id": self.id, "type": "function",
                 "function": {"name": self.name, "arguments": ""}},
                {"index": self.index, "function": {"arguments": self.arguments}}]


@dataclass(frozen=True)
class ParsedReply:
    content: str | None                 # the text outside the calls; None when there is none (as OpenAI)
    tool_calls: tuple[ToolCall, ...]
    malformed: int                      # call markers whose body did not parse; their text stays in content


@dataclass
class StreamDelta:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
