"""Workload regimes: the context a telemetry window shows, its bucket (one Optuna study each), and a
CUSUM drift detector that says when the workload has moved to another regime."""

from __future__ import annotations

import math
from dataclasses import dataclass

from telemetry.window import WindowSummary

KV_HIGH = 0.75     # mean KV usage above this at regime entry labels the regime KV-bound
CACHED = 0.5       # a prefix-cache hit rate at or above this labels the regime as mostly cached prompts
# the hit rate enters drift detection scaled to octaves: a move of 0.5 (none to mostly cached) counts
# as two octaves of the other signals, so it alarms as fast as a 4x change of the rate
HIT_RATE_OCTAVES = 4.0


@dataclass(frozen=True)
class WorkloadContext:
    io_ratio: float | None          # prompt tokens per output token
    arrival_rate_rps: float
    kv_usage: float
    prefix_hit_rate: float | None = None   # cached share of admitted prompt tokens (None: none admitted)

    @staticmethod
    def of(window: WindowSummary) -> WorkloadContext:
        return WorkloadContext(window.input_output_ratio, window.arrival_rate_rps, window.kv_usage_mean,
                               window.prefix_cache_hit_rate)

    def as_dict(self) -> dict[str, float | None]:
        return {"io_ratio": self.io_ratio, "arrival_rate_rps": self.arrival_rate_rps, "kv_usage": self.kv_usage,
                "prefix_hit_rate": self.prefix_hit_rate}

    def signals(self) -> tuple[float, float, float] | None:
        """log2 of the token ratio and of the rate, and the scaled hit rate: what drift is measured
        on (None without traffic). A cached prompt costs little to prefill, so a workload that turns
        mostly cached is a new regime even at the same lengths and rate."""
        if not self.io_ratio or self.arrival_rate_rps <= 0:
            return None
        return (math.log2(self.io_ratio), math.log2(self.arrival_rate_rps),
                HIT_RATE_OCTAVES * (self.prefix_hit_rate or 0.0))


@dataclass(frozen=True)
class Regime:
    io_ratio_bucket: int            # round(log2(prompt/output tokens))
    rate_bucket: int                # round(log2(requests/s))
    kv: str                         # "low" | "high"
    cache: str = "none"             # "none" | "high": prefix-cache hit rate below or at/above CACHED

    @property
    def key(self) -> str:
        """Keys of uncached regimes are as before prefix caching, so existing studies carry on."""
        key = f"io=2^{self.io_ratio_bucket}|rate=2^{self.rate_bucket}|kv={self.kv}"
        return key if self.cache == "none" else f"{key}|cache={self.cache}"

    @staticmethod
    def of(context: WorkloadContext) -> Regime | None:
        signals = context.signals()
        if signals is None:
            return None
        io, rate = signals[:2]
        return Regime(round(io), round(rate), "high" if context.kv_usage > KV_HIGH else "low",
                      "high" if (context.prefix_hit_rate or 0.0) >= CACHED else "none")

    def as_dict(self) -> dict[str, int | str]:
        return {"io_ratio_bucket": self.io_ratio_bucket, "rate_bucket": self.rate_bucket, "kv": self.kv,
                "cache": self.cache}


class DriftDetector:
    """Two-sided CUSUM on each signal (log2 units) against the regime's reference level.

    `slack` ignores wobble up to half an octave (a minute of Poisson arrivals at 1 request/s
    wobbles by ~0.2 octave, the token ratio of chat requests by more); an alarm needs the
    accumulated excess to pass `threshold` (a sustained move of two octaves trips it in two windows)."""

    def __init__(self, slack: float = 0.5, threshold: float = 2.0) -> None:
        self.slack, self.threshold = slack, threshold
        self.reference: tuple[float, ...] | None = None
        self._high: list[float] = []
        self._low: list[float] = []

    def reset(self, reference: tuple[float, ...]) -> None:
        self.reference = reference
        self._high, self._low = [0.0] * len(reference), [0.0] * len(reference)

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
