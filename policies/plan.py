"""A policy's answer for one step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class ScheduledChunk(NamedTuple):   # a named tuple: made for every request every step, cheaper than a frozen dataclass
    request_id: str
    num_tokens: int          # 1 for a decode, the chunk length for a prefill


@dataclass
class BatchPlan:
    scheduled: list[ScheduledChunk] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)     # waiting requests that start running this step
    preempted: list[str] = field(default_factory=list)    # running requests whose KV is freed (recompute later)
    drafts: dict[str, int] = field(default_factory=dict)  # decodes that verify this many drafted tokens (speculation)

    @property
    def num_tokens(self) -> int:
        """Tokens computed: the chunks' and the drafted tokens verified."""
        return sum(c.num_tokens for c in self.scheduled) + sum(self.drafts.values())
