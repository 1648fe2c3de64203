"""Prompt lookup: the continuation of the latest earlier occurrence of a request's last n tokens,
searched in its prompt and its output so far (longest n first). Where the output repeats the input
(code editing, summaries quoting their source, retrieval answers) the next tokens are often exactly
those that followed the same n tokens before; where nothing matches, nothing is drafted and the
request decodes as without speculation.

The index is built incrementally, one entry per n per token, so a proposal costs a few dictionary
lookups however long the context: a scan of an 8k-token context per request per step would cost the
engine loop ~0.1 ms a request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

DEFAULT_MIN_NGRAM = 2     # a single repeated token is too weak a match: drafts from it are mostly rejected
DEFAULT_MAX_NGRAM = 4


class Tokens(NamedTuple):
    """A request's prompt and output read as one sequence, without copying them every step."""

    prompt: Sequence[int]
    output: Sequence[int]

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    def window(self, start: int, end: int) -> tuple[int, ...]:
        p = len(self.prompt)
        if start >= p:
            return tuple(self.output[start - p:end - p])
        if end <= p:
            return tuple(self.prompt[start:end])
        return tuple(self.prompt[start:]) + tuple(self.output[:end - p])


@dataclass
class NgramIndex:
    """For each n in [min_n, max_n]: n-gram -> the position just after its latest occurrence that ends
    before the request's last token (so the latest match of the current suffix is never itself)."""

    min_n: int = DEFAULT_MIN_NGRAM
    max_n: int = DEFAULT_MAX_NGRAM
    latest: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed_until: int = 0      # n-grams ending before this position are in `latest`

    def update(self, tokens: Tokens) -> None:
        """Index the n-grams that end before the last token of `tokens` (which only ever grows)."""
        latest, length = self.latest, len(tokens)
        start = max(self.indexed_until, self.min_n)
        if start >= length:
            return
        tail = tokens.window(start - self.max_n if start > self.max_n else 0, length)
        offset = length - len(tail)
        for end in range(start, length):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                latest[tail[end - n - offset:end - offset]] = end
        self.indexed_until = length

    def propose(self, tokens: Tokens, k: int) -> list[int]:
        """Up to `k` tokens following the latest earlier occurrence of the longest suffix of `tokens` that
        occurred before; [] where none did."""
        if k <= 0:
            return []
        self.update(tokens)
        length = len(tokens)
        suffix = tokens.window(max(0, length - self.max_n), length)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            end = self.latest.get(suffix[len(suffix) - n:])
            if end is not None:
                return list(tokens.window(end, min(end + k, length)))
        return []


class NgramDrafter:
    """One index per request, made on its first proposal and dropped when it finishes."""

    name = "ngram"

    def __init__(self, min_n: int = DEFAULT_MIN_NGRAM, max_n: int = DEFAULT_MAX_NGRAM) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, request_id: str, prompt: Sequence[int], output: Sequence[int], k: int) -> list[int]:
        index = self._indexes.get(request_id)
        if index is None:
            index = self._indexes[request_id] = NgramIndex(self.min_n, self.max_n)
        return index.propose(Tokens(prompt, output), k)

    def forget(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)
