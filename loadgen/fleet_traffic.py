"""A day of traffic for a fleet: a diurnal arrival rate (a sinusoid with noise) with bursts of
3-5x for 1-5 minutes, and the workload's requests arriving at it (a Poisson process of that
varying rate, drawn by thinning).

The day can be compressed (`day_s` < 86,400): the sinusoid then climbs from trough to peak
faster, while bursts, start-ups and planning intervals keep their real lengths, so a compressed
day is harder for an autoscaler than the real one, not easier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from loadgen.workload import RequestSpec, Workload, generate


@dataclass(frozen=True)
class Burst:
    start_s: float
    length_s: float
    factor: float             # the rate during the burst, times the diurnal rate


@dataclass(frozen=True)
class DiurnalShape:
    peak_rps: float                   # the sinusoid's top (bursts go above it)
    day_s: float = 86_400.0           # one period
    trough: float = 0.2               # the bottom, as a fraction of the peak
    peak_at: float = 16 / 24          # where in the day the peak falls (16:00)
    noise: float = 0.1                # relative standard deviation of the noise...
    noise_period_s: float = 60.0      # ...held this long, then drawn again
    bursts_per_day: float = 3.0
    burst_factor: tuple[float, float] = (3.0, 5.0)
    burst_length_s: tuple[float, float] = (60.0, 300.0)

    def __post_init__(self) -> None:
        if not (self.peak_rps > 0 and self.day_s > 0 and 0 < self.trough <= 1 and self.noise_period_s > 0):
            raise ValueError("diurnal: need peak_rps > 0, day_s > 0, 0 < trough <= 1, noise_period_s > 0")
        if self.noise < 0 or self.bursts_per_day < 0:
            raise ValueError("diurnal: noise and bursts_per_day must be >= 0")
        if not (1 <= self.burst_factor[0] <= self.burst_factor[1] and 0 < self.burst_length_s[0] <= self.burst_length_s[1]):
            raise ValueError("diurnal: burst factor and length ranges must be [low, high] with 1 <= factor, 0 < length")


@dataclass(frozen=True)
class RateCurve:
    """A drawn day: the sinusoid, its noise (one factor per noise period) and its bursts."""

    shape: DiurnalShape
    noise: tuple[float, ...]
    bursts: tuple[Burst, ...]

    @staticmethod
    def draw(shape: DiurnalShape, seed: int = 0) -> RateCurve:
        rng = np.random.default_rng([seed, 7])
        periods = math.ceil(shape.day_s / shape.noise_period_s) + 1
        noise = tuple(float(x) for x in np.clip(rng.normal(1.0, shape.noise, periods), 0.1, None))
        count = round(shape.bursts_per_day)       # a fixed count: every drawn day has its bursts
        bursts = tuple(sorted((Burst(float(rng.uniform(0, shape.day_s)), float(rng.uniform(*shape.burst_length_s)),
                                     float(rng.uniform(*shape.burst_factor))) for _ in range(count)),
                              key=lambda b: b.start_s))
        return RateCurve(shape, noise, bursts)

    def base(self, t: float) -> float:
        """The sinusoid alone: trough at peak_at - half a day, peak at peak_at."""
        s = self.shape
        phase = 2 * math.pi * (t / s.day_s - s.peak_at)
        return s.peak_rps * (s.trough + (1 - s.trough) * (1 + math.cos(phase)) / 2)

    def burst_factor(self, t: float) -> float:
        return max((b.factor for b in self.bursts if b.start_s <= t < b.start_s + b.length_s), default=1.0)

    def rate(self, t: float) -> float:
        noise = self.noise[min(int(t // self.shape.noise_period_s), len(self.noise) - 1)]
        return self.base(t) * noise * self.burst_factor(t)

    def max_rate(self) -> float:
        return self.shape.peak_rps * max(self.noise) * max((b.factor for b in self.bursts), default=1.0)

    def arrivals(self, seed: int = 0) -> np.ndarray:
        """Arrival times of a Poisson process of this rate over the day (Lewis-Shedler thinning)."""
        rng = np.random.default_rng([seed, 11])
        top = self.max_rate()
        n = int(top * self.shape.day_s + 10 * math.sqrt(top * self.shape.day_s) + 10)
        candidates = np.cumsum(rng.exponential(1.0 / top, n))
        candidates = candidates[candidates < self.shape.day_s]
        keep = rng.uniform(0, top, len(candidates)) < self.rates(candidates)
        return candidates[keep]

    def rates(self, times: np.ndarray) -> np.ndarray:
        """rate(t) at each of `times`, vectorized (a day of real length draws millions of candidates)."""
        s = self.shape
        base = s.peak_rps * (s.trough + (1 - s.trough) * (1 + np.cos(2 * np.pi * (times / s.day_s - s.peak_at))) / 2)
        noise = np.asarray(self.noise)[np.minimum((times // s.noise_period_s).astype(int), len(self.noise) - 1)]
        factor = np.ones_like(times)
        for b in self.bursts:
            inside = (times >= b.start_s) & (times < b.start_s + b.length_s)
            factor[inside] = np.maximum(factor[inside], b.factor)
        return base * noise * factor


def day_requests(workload: Workload, curve: RateCurve, seed: int = 0) -> list[RequestSpec]:
    """The workload's requests (lengths, SLO classes, shared prefixes, in its streams' proportions)
    at the curve's arrival times."""
    times = curve.arrivals(seed)
    if not len(times):
        return []
    specs = generate(workload, num_requests=len(times), seed=seed)
    return [replace(spec, arrival_s=float(t)) for spec, t in zip(specs, times)]
