"""The scheduler's tunable knobs: one frozen, validated value with a version number."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KnobRange:
    low: float
    high: float
    help: str


KNOB_RANGES: dict[str, KnobRange] = {
    "token_budget": KnobRange(1, 65536, "most tokens (decode + prefill) computed in one step"),
    "max_num_seqs": KnobRange(1, 4096, "most requests running (holding KV) at once"),
}


@dataclass(frozen=True)
class Knobs:
    token_budget: int = 512
    max_num_seqs: int = 256
    version: int = 0

    def __post_init__(self) -> None:
        for name, r in KNOB_RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not r.low <= value <= r.high:
                raise ValueError(f"knob {name}={value!r} is outside [{r.low:g}, {r.high:g}] ({r.help})")

    def replace(self, **changes: Any) -> "Knobs":
        """A new validated Knobs with the next version number; unknown names are rejected."""
        unknown = set(changes) - set(KNOB_RANGES)
        if unknown:
            raise ValueError(f"unknown knob(s): {', '.join(sorted(unknown))}; known: {', '.join(KNOB_RANGES)}")
        return dataclasses.replace(self, **changes, version=self.version + 1)
