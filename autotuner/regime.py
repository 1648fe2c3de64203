"""Workload regimes: the context a telemetry window shows, its bucket (one Optuna study each), and a
CUSUM drift detector that says when the workload has moved to another regime."""

from __future__ import annotations

import math
from dataclasses import dataclass

from telemetry.window import WindowSummary

KV_HIGH = 0.75     # mean KV usage above this at regime entry labels the regime KV-bound


@dataclass(frozen=True)
class WorkloadContext:
    io_ratio: float | None          # prompt tokens per output token
    arrival_rate_rps: float
    kv_usage: float

    @staticmethod
    def of(window: WindowSummary) -> WorkloadContext:
        return WorkloadContext(window.input_output_ratio, window.arrival_rate_rps, window.kv_usage_mean)

    def as_dict(self) -> dict[str, float | None]:
        return {"io_ratio": self.io_ratio, "arrival_rate_rps": self.arrival_rate_rps, "kv_usage": self.kv_usage}

    def signals(self) -> tuple[float, float] | None:
        """log2 of the token ratio and of the rate: what drift is measured on (None without traffic)."""
        if not self.io_ratio or self.arrival_rate_rps <= 0:
            return None
        return math.log2(self.io_ratio), math.log2(self.arrival_rate_rps)


@dataclass(frozen=True)
class Regime:
    io_ratio_bucket: int            # round(log2(prompt/output tokens))
    rate_bucket: int                # round(log2(requests/s))
    kv: str                         # "low" | "high"

    @property
    def key(self) -> str:
        return f"io=2^{self.io_ratio_bucket}|rate=2^{self.rate_bucket}|kv={self.kv}"

    @staticmethod
    def of(context: WorkloadContext) -> Regime | None:
        signals = context.signals()
        if signals is None:
            return None
        io, rate = signals
        return Regime(round(io), round(rate), "high" if context.kv_usage > KV_HIGH else "low")

    def as_dict(self) -> dict[str, int | str]:
        return {"io_ratio_bucket": self.io_ratio_bucket, "rate_bucket": self.rate_bucket, "kv": self.kv}


class DriftDetector:
    """Two-sided CUSUM on each signal (log2 units) against the regime's reference level.

    `slack` ignores wobble up to half an octave (a minute of Poisson arrivals at 1 request/s
    wobbles by ~0.2 octave, the token ratio of chat requests by more); an alarm needs the
    accumulated excess to pass `threshold` (a sustained move of two octaves trips it in two windows)."""

    def __init__(self, slack: float = 0.5, threshold: float = 2.0) -> None:
        self.slack, self.threshold = slack, threshold
        self.reference: tuple[float, ...] | None = None
        self._high = [0.0, 0.0]
        self._low = [0.0, 0.0]

    def reset(self, reference: tuple[float, ...]) -> None:
        self.reference = reference
        self._high, self._low = [0.0, 0.0], [0.0, 0.0]

    def update(self, signals: tuple[float, ...]) -> bool:
        """Feed one window; True when the workload has drifted (the caller then resets)."""
        if self.reference is None:
            self.reset(signals)
            return False
        self._high, self._low = self._next(signals)
        return max(self._high + self._low) > self.threshold

    def would_fire(self, signals: tuple[float, ...]) -> bool:
        """Whether feeding `signals` now would raise the alarm, without feeding them: lets a
        measurement window end early on a workload change without changing the CUSUM's pace."""
        if self.reference is None:
            return False
        high, low = self._next(signals)
        return max(high + low) > self.threshold

    def _next(self, signals: tuple[float, ...]) -> tuple[list[float], list[float]]:
        high = [max(0.0, h + x - ref - self.slack) for h, x, ref in zip(self._high, signals, self.reference)]
        low = [max(0.0, lo + ref - x - self.slack) for lo, x, ref in zip(self._low, signals, self.reference)]
        return high, low
