"""Capacity search (Sarathi-Serve): the largest QPS at which P50 TTFT and P99 TBT stay within bounds.

Sustained, not survived: the P50 TTFT bound holds for the probe's later-arriving half too. A probe
is finite, so a server that falls behind passes on the whole probe's P50 while its queue grows:
the earlier half, served before the backlog builds, carries the median (docs/benchmarking.md,
"Capacity search"). A rate whose queue grows reaches any TTFT bound given time.

The probe is injected, so the same search runs against a live server (bench_client.live_probe)
or a simulator. It brackets first (doubling the rate from a start until a probe fails, or
halving while it fails) and then bisects between the last passing and the first failing rate
until they are within a relative tolerance or the probe budget is spent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

Probe = Callable[[float], Any]   # qps -> LatencySummary, or any mapping with its keys


@dataclass(frozen=True)
class CapacityCriteria:
    ttft_p50_s: float = 2.0
    tbt_p99_s: float = 0.25
    max_failed_fraction: float = 0.0   # an overloaded open-loop run leaves requests unfinished
    sustained: bool = True             # the probe's later half meets the P50 TTFT bound too (a summary
                                       # without ttft_p50_late_s, from before it existed, is judged without)

    def __post_init__(self) -> None:
        if not (self.ttft_p50_s > 0 and self.tbt_p99_s > 0):
            raise ValueError("the TTFT and TBT bounds must be > 0")
        if not 0 <= self.max_failed_fraction < 1:
            raise ValueError(f"max_failed_fraction must be in [0, 1), got {self.max_failed_fraction}")

    def passes(self, summary: Mapping[str, Any]) -> bool:
        n, finished = summary["num_requests"], summary["num_finished"]
        if not n or not finished or (n - finished) / n > self.max_failed_fraction:
            return False
        ttft, tbt = summary["ttft_p50_s"], summary["tbt_p99_s"]
        late = summary.get("ttft_p50_late_s") if self.sustained else None
        # no TBT at all (single-token outputs) is not a violation
        return (ttft is not None and ttft <= self.ttft_p50_s and (late is None or late <= self.ttft_p50_s)
                and (tbt is None or tbt <= self.tbt_p99_s))


@dataclass(frozen=True)
class ProbeResult:
    qps: float
    passed: bool
    summary: dict[str, Any]


@dataclass(frozen=True)
class CapacityResult:
    capacity_qps: float             # largest passing rate probed; 0.0 when none passed
    first_failing_qps: float | None  # None: no probe failed, capacity is only a lower bound
    probes: tuple[ProbeResult, ...]
    criteria: CapacityCriteria

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def search_capacity(probe: Probe, criteria: CapacityCriteria = CapacityCriteria(), start_qps: float = 1.0,
                    max_probes: int = 8, tolerance: float = 0.05, min_qps: float = 1e-3) -> CapacityResult:
    check_search(start_qps, max_probes, tolerance)
    probes: list[ProbeResult] = []

    def run(qps: float) -> bool:
        summary = _as_dict(probe(qps))
        probes.append(ProbeResult(qps, criteria.passes(summary), summary))
        return probes[-1].passed

    lo, hi = _bracket(run, start_qps, max_probes, min_qps)
    while lo is not None and hi is not None and len(probes) < max_probes and hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if run(mid) else (lo, mid)
    return CapacityResult(lo or 0.0, hi, tuple(probes), criteria)


def probe_size(qps: float, num_requests: int, min_duration_s: float = 0.0) -> int:
    """Requests in a probe at `qps`: `num_requests`, or more where that many would arrive within
    `min_duration_s`. A probe of a fixed count shortens as the rate grows, and a server over its
    sustained capacity passes a short one by queueing the burst: a floor on the probe's length
    makes its rate one the server keeps up with."""
    return max(num_requests, math.ceil(qps * min_duration_s))


def check_search(start_qps: float, max_probes: int, tolerance: float) -> None:
    """Raises ValueError for search settings that cannot work (before any probe costs time)."""
    if not start_qps > 0:
        raise ValueError(f"start_qps must be > 0, got {start_qps}")
    if max_probes < 1:
        raise ValueError(f"max_probes must be >= 1, got {max_probes}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance}")


def _bracket(run: Callable[[float], bool], start: float, max_probes: int,
             min_qps: float) -> tuple[float | None, float | None]:
    """(last passing, first failing) rate: doubling up from a pass, halving down from a failure."""
    lo, hi = None, None
    qps, used = start, 0
    while used < max_probes:
        used += 1
        if run(qps):
            lo = qps
            if hi is not None:
                break
            qps *= 2
        else:
            hi = qps
            if lo is not None or qps / 2 < min_qps:
                break
            qps /= 2
    return lo, hi


def _as_dict(summary: Any) -> dict[str, Any]:
    return dict(summary.as_dict() if hasattr(summary, "as_dict") else summary)
