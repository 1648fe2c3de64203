"""Sliding telemetry windows: the one summary the controller reads.

Fed only StepRecords, RequestRecords and arrivals, so the real engine and a simulator produce
the same WindowSummary. Times are on the time.monotonic() clock of the records.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from engine.outputs import RequestRecord, StepRecord
from engine.slo_class import SloClass
from telemetry.hardware import DevicePeaks
from telemetry.model_cost import ModelCost


def meets_slo(r: RequestRecord, slo: SloClass) -> bool:
    """Judged by the request's own SLO class targets where it carries them, else by `slo`'s."""
    ttft_s = r.slo_ttft_s if r.slo_ttft_s is not None else slo.ttft_s
    tbt_s = r.slo_tbt_s if r.slo_tbt_s is not None else slo.tbt_s
    if r.finish_reason not in ("stop", "length") or r.ttft_s is None or r.ttft_s > ttft_s:
        return False
    gaps = r.tbt_s
    return not gaps or percentile(gaps, slo.tbt_percentile) <= tbt_s


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation) of a non-empty list, in plain Python: a
    summary judges every request's own gaps, and numpy's per-call overhead (~50 us) made that the
    larger part of summarizing a 10,000-request simulation."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass(frozen=True)
class Arrival:
    time: float
    num_prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class WindowSummary:
    start: float
    seconds: float
    num_arrivals: int
    arrival_rate_rps: float
    num_finished: int
    finished_by_reason: dict[str, int]
    input_output_ratio: float | None       # prompt tokens per output token of the window's requests
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tbt_p50_s: float | None
    tbt_p99_s: float | None
    tpot_p50_s: float | None
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    slo_attainment: float | None
    goodput_rps: float
    num_steps: int
    busy_fraction: float                   # share of the window the engine spent in steps
    step_time_mean_s: float | None
    kv_usage_mean: float
    kv_usage_max: float
    num_running_mean: float
    num_waiting_mean: float
    num_preemptions: int
    mfu: float | None
    mbu: float | None
    prefix_cache_hit_rate: float | None = None   # cached share of the prompt tokens admitted in the window
    hardware: dict[str, float] = field(default_factory=dict)
    goodput_by_class: dict[str, float] = field(default_factory=dict)           # SLO class -> requests/s met
    slo_attainment_by_class: dict[str, float] = field(default_factory=dict)    # SLO class -> share met
    finished_by_class: dict[str, int] = field(default_factory=dict)
    ttft_p50_by_class: dict[str, float | None] = field(default_factory=dict)   # of the class's finished requests
    tbt_p99_by_class: dict[str, float | None] = field(default_factory=dict)    # their gaps, pooled per class
    shed_rps: float = 0.0                  # requests admission answered 429 (they count as finished and missed)
    draft_tokens_per_s: float = 0.0        # drafted tokens verified (speculative decoding; among the decode rows)
    kept_draft_tokens_per_s: float = 0.0   # ... of them accepted: output tokens beyond one per decode
    draft_acceptance_rate: float | None = None     # kept / drafted; None where nothing was drafted
    draft_tokens_per_verify: float | None = None   # mean draft length of a decode that verified drafts (k)
    draft_tokens_per_decode: float | None = None   # the same over every decode, k = 0 included


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


HORIZON_S = 600.0   # how far back a TelemetryWindow keeps records by default (the tuner's windows stay within it)


class TelemetryWindow:
    """Keeps the last `horizon_s` of records; `window(seconds)` summarises the most recent part."""

    def __init__(self, slo: SloClass | None = None, cost: ModelCost | None = None, peaks: DevicePeaks | None = None,
                 horizon_s: float = HORIZON_S, clock=time.monotonic) -> None:
        self.slo = slo or SloClass()
        self.cost, self.peaks = cost, peaks
        self.horizon_s = horizon_s
        self.clock = clock
        self._steps: deque[StepRecord] = deque()
        self._finished: deque[RequestRecord] = deque()
        self._arrivals: deque[Arrival] = deque()
        self._lock = threading.Lock()
        self.hardware: dict[str, float] = {}     # latest device sample (NVML or CPU), set by samplers

    def on_step(self, r: StepRecord) -> None:
        with self._lock:
            self._steps.append(r)
            self._trim(r.start)

    def on_finish(self, r: RequestRecord) -> None:
        with self._lock:
            self._finished.append(r)

    def on_arrival(self, a: Arrival) -> None:
        with self._lock:
            self._arrivals.append(a)

    def _trim(self, now: float) -> None:
        horizon = now - self.horizon_s
        for q, when in ((self._steps, lambda s: s.start), (self._finished, lambda r: r.finished),
                        (self._arrivals, lambda a: a.time)):
            while q and when(q[0]) < horizon:
                q.popleft()

    def window(self, seconds: float, now: float | None = None) -> WindowSummary:
        now = self.clock() if now is None else now
        start = now - seconds
        with self._lock:
            steps = [s for s in self._steps if s.start >= start]
            finished = [r for r in self._finished if r.finished >= start]
            arrivals = [a for a in self._arrivals if a.time >= start]
        return self._summarise(start, seconds, steps, finished, arrivals)

    def recent_requests(self, seconds: float, now: float | None = None) -> list[RequestRecord]:
        """Requests finished in the last `seconds`: the observed workload, e.g. for a simulator."""
        start = (self.clock() if now is None else now) - seconds
        with self._lock:
            return [r for r in self._finished if r.finished >= start]

    def _summarise(self, start: float, seconds: float, steps: list[StepRecord], finished: list[RequestRecord],
                   arrivals: list[Arrival]) -> WindowSummary:
        ttft = [r.ttft_s for r in finished if r.ttft_s is not None]
        tbt = [g for s in steps for g in s.token_gaps]     # tokens produced in the window, not before it
        tpot = [r.tpot_s for r in finished if r.tpot_s is not None]
        e2e = [r.e2e_s for r in finished]
        met_by = [meets_slo(r, self.slo) for r in finished]
        met = sum(met_by)
        by_class = _by_class(finished, met_by)
        busy = sum(s.duration_s for s in steps)
        return WindowSummary(
            start=start, seconds=seconds, num_arrivals=len(arrivals), arrival_rate_rps=len(arrivals) / seconds,
            num_finished=len(finished), finished_by_reason=dict(Counter(r.finish_reason for r in finished)),
            input_output_ratio=_token_ratio(finished, arrivals),
            prompt_tokens_per_s=sum(s.num_prefill_tokens for s in steps) / seconds,
            output_tokens_per_s=sum(s.num_sampled for s in steps) / seconds,
            ttft_p50_s=_pct(ttft, 50), ttft_p99_s=_pct(ttft, 99), tbt_p50_s=_pct(tbt, 50), tbt_p99_s=_pct(tbt, 99),
            tpot_p50_s=_pct(tpot, 50), e2e_p50_s=_pct(e2e, 50), e2e_p99_s=_pct(e2e, 99),
            slo_attainment=met / len(finished) if finished else None, goodput_rps=met / seconds,
            shed_rps=sum(r.finish_reason == "shed" for r in finished) / seconds,
            **_speculation(steps, seconds),
            num_steps=len(steps), busy_fraction=min(1.0, busy / seconds),
            step_time_mean_s=busy / len(steps) if steps else None,
            kv_usage_mean=float(np.mean([s.kv_usage for s in steps])) if steps else 0.0,
            kv_usage_max=max((s.kv_usage for s in steps), default=0.0),
            num_running_mean=float(np.mean([s.num_running for s in steps])) if steps else 0.0,
            num_waiting_mean=float(np.mean([s.num_waiting for s in steps])) if steps else 0.0,
            num_preemptions=sum(s.num_preempted for s in steps),
            mfu=self._utilisation(steps, seconds, "flops"), mbu=self._utilisation(steps, seconds, "bytes"),
            prefix_cache_hit_rate=_hit_rate(steps), hardware=dict(self.hardware),
            goodput_by_class={c: sum(m) / seconds for c, m in by_class.items()},
            slo_attainment_by_class={c: sum(m) / len(m) for c, m in by_class.items()},
            finished_by_class={c: len(m) for c, m in by_class.items()},
            ttft_p50_by_class={c: _pct([r.ttft_s for r in finished if r.slo_class == c and r.ttft_s is not None], 50)
                               for c in by_class},
            tbt_p99_by_class={c: _pct([g for r in finished if r.slo_class == c for g in r.tbt_s], 99)
                              for c in by_class})

    def _utilisation(self, steps: list[StepRecord], seconds: float, kind: str) -> float | None:
        if self.cost is None or self.peaks is None:
            return None
        if kind == "flops":
            return sum(self.cost.step_flops(s) for s in steps) / (seconds * self.peaks.flops_per_s)
        return sum(self.cost.step_bytes(s) for s in steps) / (seconds * self.peaks.bytes_per_s)


def _by_class(records: list[RequestRecord], met: list[bool]) -> dict[str, list[bool]]:
    """Each SLO class's verdicts, classes in order of first appearance."""
    out: dict[str, list[bool]] = {}
    for r, m in zip(records, met):
        out.setdefault(r.slo_class, []).append(m)
    return out


def _speculation(steps: list[StepRecord], seconds: float) -> dict[str, float | None]:
    """The window's draft fields: a decode verifying d drafts is d + 1 decode rows of the record."""
    drafted = sum(s.draft_tokens for s in steps)
    kept = sum(s.kept_draft_tokens for s in steps)
    verifying = sum(s.draft_seqs for s in steps)
    decodes = sum(s.num_decode_tokens for s in steps) - drafted
    return {"draft_tokens_per_s": drafted / seconds, "kept_draft_tokens_per_s": kept / seconds,
            "draft_acceptance_rate": kept / drafted if drafted else None,
            "draft_tokens_per_verify": drafted / verifying if verifying else None,
            "draft_tokens_per_decode": drafted / decodes if decodes > 0 else None}


def _hit_rate(steps: list[StepRecord]) -> float | None:
    queries = sum(s.prefix_cache_queries for s in steps)
    return sum(s.prefix_cache_hits for s in steps) / queries if queries else None


def _token_ratio(finished: list[RequestRecord], arrivals: list[Arrival]) -> float | None:
    """Observed prompt:output tokens; from arrivals' max_tokens until requests finish in the window."""
    if finished:
        out = sum(r.num_output_tokens for r in finished)
        return sum(r.num_prompt_tokens for r in finished) / out if out else None
    if arrivals:
        return sum(a.num_prompt_tokens for a in arrivals) / sum(a.max_tokens for a in arrivals)
    return None
