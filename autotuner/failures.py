"""What failed in the tuner itself, per stage: a warm start (its simulations in the background
process), a TPE sample (the same), the tuner's storage (its SQLite file corrupt, locked or on a
read-only disk). A failure never stops serving, so it must be seen elsewhere: counted here for
`tuner status`, on /metrics and in the report, and logged once per cause."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

STAGES = ("warm_start", "sample", "storage")      # the stages /metrics shows from the start (at 0)


@dataclass(frozen=True)
class StageFailures:
    count: int
    last_cause: str
    last_t: float                      # seconds since the controller started


class TunerFailures:
    """Failure counts and the latest cause per stage; safe to read from any thread."""

    def __init__(self) -> None:
        self._stages: dict[str, StageFailures] = {}
        self._lock = threading.Lock()

    def record(self, stage: str, cause: str, t: float) -> bool:
        """Count a failure; True where its cause is new for the stage (the one time to say it)."""
        with self._lock:
            last = self._stages.get(stage)
            self._stages[stage] = StageFailures((last.count if last else 0) + 1, cause, round(t, 3))
            return last is None or last.last_cause != cause

    def count(self, stage: str) -> int:
        with self._lock:
            return self._stages[stage].count if stage in self._stages else 0

    def as_dict(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {stage: asdict(f) for stage, f in self._stages.items()}
