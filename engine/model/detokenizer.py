"""Incremental detokenization and stop-string handling for one request.

Text is decoded from a sliding window of ids (Hugging Face TGI's prefix/read offsets), so a
multi-byte character split across tokens is emitted only once it is whole. Text that could be the
start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

from engine.model.tokenizer import Tokenizer


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""          # everything decoded so far (up to a stop string)
        self._emitted = 0       # characters of `text` already returned as deltas
        self.stopped = False

    def add(self, output_ids: list[int]) -> None:
        """Decode what the newest token(s) in `output_ids` complete; stops at a stop string."""
        if self.stopped:
            return
        decode = self._tokenizer.decode
        prefix = decode(output_ids[self._prefix_offset:self._read_offset])
        full = decode(output_ids[self._prefix_offset:])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return
        search_from = max(0, len(self.text) - self._hold)
        self.text += full[len(prefix):]
        self._prefix_offset, self._read_offset = self._read_offset, len(output_ids)
        for stop in self._stop:
            at = self.text.find(stop, search_from)
            if at >= 0:
                self.text = self.text[:at]
                self.stopped = True

    def delta(self, final: bool) -> str:
        """New text safe to show: all of it at the end, else all but what may begin a stop string."""
        end = len(self.text) if final or self.stopped else max(self._emitted, len(self.text) - self._hold)
        out = self.text[self._emitted:end]
        self._emitted = end
        return out
