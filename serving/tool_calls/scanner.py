"""The scan shared by every format: text up to the next call marker is content; at a marker the format
reads a region (one or more calls, a malformed call, or a false alarm).

The scan works on a growing text: with `final` False it stops, without deciding, where a marker or the
start of one is still open (a partial `<tool_ca` at the end, a call whose end has not come), and every
decision it does take is the one it would take on any continuation of the text. That is what makes a
streamed reply come out the same as the whole reply parsed at once, whatever the chunks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Union


@dataclass(frozen=True)
class Region:
    """What a format read at a marker, up to `end`: calls (name, arguments); else `malformed` (a marker
    whose body did not parse, its text content); else neither (the marker was plain text after all)."""

    end: int
    calls: tuple[tuple[str, str], ...] = ()
    malformed: bool = False


class RegionReader(Protocol):
    markers: tuple[str, ...]       # strings a call region starts with
    separator: str                 # written between consecutive calls ("" none); not content

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        """The region at text[start] (which begins with one of `markers`), or None where it is not
        decided yet (never when `final`)."""
        ...


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Calls:
    calls: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Malformed:
    text: str


Event = Union[Text, Calls, Malformed]


def scan(reader: RegionReader, text: str, final: bool) -> tuple[list[Event], int]:
    """The events of `text` and how much of it they cover (the rest is undecided)."""
    events: list[Event] = []
    pos = 0
    while pos < len(text):
        at, whole = next_marker(reader.markers, text, pos)
        if at > pos:
            events.append(Text(text[pos:at]))
            pos = at
        if at == len(text):
            break
        if not whole:                       # the text ends inside what may become a marker
            if final:
                events.append(Text(text[pos:]))
                pos = len(text)
            break
        region = reader.read_region(text, at, final)
        if region is None:
            break
        events.append(_event(text, at, region))
        pos = region.end
    return events, pos


def _event(text: str, start: int, region: Region) -> Event:
    if region.calls:
        return Calls(region.calls)
    if region.malformed:
        return Malformed(text[start:region.end])
    return Text(text[start:region.end])


def next_marker(markers: tuple[str, ...], text: str, pos: int) -> tuple[int, bool]:
    """The first index from `pos` where a marker occurs (True) or where the text ends with a marker's
    beginning (False); len(text) where neither."""
    best, whole = len(text), False
    for marker in markers:
        at = text.find(marker, pos)
        if at >= 0 and (at < best or (at == best and not whole)):
            best, whole = at, True
        partial = partial_at_end(marker, text, pos)
        if partial < best:
            best, whole = partial, False
    return best, whole


def partial_at_end(marker: str, text: str, pos: int) -> int:
    """The index of the longest proper prefix of `marker` that the text ends with (from `pos`)."""
    for k in range(min(len(marker) - 1, len(text) - pos), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)
