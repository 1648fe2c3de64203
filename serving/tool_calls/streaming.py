"""The incremental parser: text deltas in, content deltas and OpenAI tool-call deltas out.

A call is sent once it is whole (its end marker seen, or its JSON closed, or the reply ended), as its
id-and-name delta followed by one delta with its arguments: a call is only known to be one, and not
malformed text that stays content, when it is complete, and a delta once sent cannot be taken back.
Content is sent as soon as it cannot be the start of a call. A whole reply is parsed by the same code
in one piece, so both agree by construction."""

from __future__ import annotations

from typing import Any

from serving.tool_calls.call import CallId, ParsedReply, StreamDelta, ToolCall
from serving.tool_calls.content import ContentShaper
from serving.tool_calls.scanner import Calls, Malformed, RegionReader, scan


class ToolCallStreamer:
    def __init__(self, reader: RegionReader, call_id: CallId) -> None:
        self._reader, self._call_id = reader, call_id
        self._pending = ""                 # text not decided yet
        self._shaper = ContentShaper(reader.separator)
        self.calls: list[ToolCall] = []    # the calls sent so far
        self.malformed = 0                 # call markers whose body did not parse, so far
        self._finished = False

    def feed(self, text_delta: str) -> StreamDelta:
        if self._finished:
            raise RuntimeError("the streamer has finished")
        self._pending += text_delta
        return self._run(final=False)

    def finish(self) -> StreamDelta:
        """Decides and sends what was held back; the streamer takes no text after this."""
        delta = self._run(final=True)
        self._shaper.finish()
        self._finished = True
        return delta

    def _run(self, final: bool) -> StreamDelta:
        events, used = scan(self._reader, self._pending, final)
        self._pending = self._pending[used:]
        content: list[str] = []
        tool_calls: list[dict[str, Any]] = []
        for event in events:
            if isinstance(event, Calls):
                self._shaper.call()
                tool_calls.extend(self._add_calls(event))
            else:
                if isinstance(event, Malformed):
                    self.malformed += 1
                content.append(self._shaper.text(event.text))
        if any(isinstance(e, Calls) or e.text.strip() for e in events):
            # the reply has begun: a format that reads its opening otherwise (hermes' bare call) reads on as text
            self._reader = getattr(self._reader, "after_start", self._reader)
        return StreamDelta("".join(content), tool_calls)

    def _add_calls(self, event: Calls) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for name, arguments in event.calls:
            index = len(self.calls)
            call = ToolCall(index, self._call_id(index), name, arguments)
            self.calls.append(call)
            deltas.extend(call.deltas())
        return deltas


def parse_text(reader: RegionReader, text: str, call_id: CallId) -> ParsedReply:
    streamer = ToolCallStreamer(reader, call_id)
    content = streamer.feed(text).content + streamer.finish().content
    return ParsedReply(content or None, tuple(streamer.calls), streamer.malformed)
