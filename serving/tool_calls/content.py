"""The content of a reply with calls in it, shaped the same whether it comes whole or in pieces.

Content is the text outside the calls, stripped at both ends, with what lies between two calls (or after
the last one) dropped where it is only whitespace and at most one separator: the newline between two
Hermes blocks, the `; ` between two Llama calls. Streamed, whitespace is held back until something other
than whitespace follows it (it may turn out to be the end), and the text after a call until it is known
not to be a separator."""

from __future__ import annotations

from serving.tool_calls.json_object import WHITESPACE


class ContentShaper:
    def __init__(self, separator: str = "") -> None:
        self._separator = separator
        self._held = ""          # whitespace after the last text given out
        self._gap = ""           # the text since the last call, while it may be only a separator
        self._after_call = False
        self._started = False    # any text given out yet (leading whitespace is dropped)

    def text(self, piece: str) -> str:
        """The part of `piece` (content, in order) that can be given out now."""
        if self._after_call:
            self._gap += piece
            if self._is_gap(self._gap):
                return ""
            piece, self._gap, self._after_call = self._gap, "", False
        piece, self._held = self._held + piece, ""
        body = piece.rstrip(WHITESPACE)
        self._held = piece[len(body):]
        if not self._started:
            body = body.lstrip(WHITESPACE)
        self._started = self._started or bool(body)
        return body

    def call(self) -> None:
        """A call came: text since the previous call that is only a separator is not content."""
        self._gap = ""
        self._after_call = True

    def finish(self) -> None:
        """The reply ended: what is held (trailing whitespace, a separator after the last call) is not
        content."""
        self._held = self._gap = ""

    def _is_gap(self, text: str) -> bool:
        rest = text.replace(self._separator, "", 1) if self._separator else text
        return not rest.strip(WHITESPACE)
