"""One latency/throughput summary of a finished run, shared by the bench client and the simulator.

Both build RequestRecords (the bench from client-side timestamps) and call summarize_requests,
so their JSON carries the same keys. Unlike a TelemetryWindow it sees every request of the run,
so requests that failed or never finished count against SLO attainment and goodput.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from telemetry.window import meets_slo

FINISHED = ("stop", "length")


@dataclass(frozen=True)
class LatencySummary:
    num_requests: int
    num_finished: int                 # finish_reason stop or length; the rest failed
    num_failed: int
    duration_s: float
    ttft_mean_s: float | None         # time to first token, of finished requests
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    # P50 TTFT of the requests that arrived in the run's second half (unfinished ones count as never
    # served): a queue that grows through the run shows here, where the whole run's P50 still hides it
    ttft_p50_late_s: float | None
    tbt_mean_s: float | None          # gaps between consecutive streamed tokens, pooled over requests
    tbt_p50_s: float | None
    tbt_p90_s: float | None
    tbt_p99_s: float | None
    tpot_p50_s: float | None          # per request: (last token - first token) / (output tokens - 1)
    tpot_p99_s: float | None
    e2e_p50_s: float | None           # arrival to last token
    e2e_p90_s: float | None
    e2e_p99_s: float | None
    request_throughput_rps: float     # finished requests per second of the run
    output_tokens_per_s: float
    prompt_tokens_per_s: float
    goodput_rps: float                # requests per second meeting every SLO (DistServe)
    slo_attainment: float | None      # share of all requests meeting every SLO
    slo_ttft_s: float
    slo_tbt_s: float
    # SLO class -> num_requests, goodput_rps, slo_attainment, ttft_p50_s, tbt_p99_s (each judged by its targets)
    by_class: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_requests(records: list[RequestRecord], slo: SloClass, duration_s: float) -> LatencySummary:
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    done = [r for r in records if r.finish_reason in FINISHED]
    ttft = np.array([r.ttft_s for r in done if r.ttft_s is not None], dtype=float)
    tbt = _gaps(done)             # pooled over requests: millions of gaps after a long simulation
    tpot = [t for t in map(_tpot, done) if t is not None]
    e2e = [r.e2e_s for r in done]
    met_each = [meets_slo(r, slo) for r in records]
    met = sum(met_each)
    ttft_p50, ttft_p90, ttft_p99 = _pcts(ttft, (50, 90, 99))
    tbt_p50, tbt_p90, tbt_p99 = _pcts(tbt, (50, 90, 99))
    e2e_p50, e2e_p90, e2e_p99 = _pcts(e2e, (50, 90, 99))
    by_class = _by_class(records, met_each, duration_s, (ttft_p50, tbt_p99))
    return LatencySummary(
        num_requests=len(records), num_finished=len(done), num_failed=len(records) - len(done),
        duration_s=duration_s,
        ttft_mean_s=_mean(ttft), ttft_p50_s=ttft_p50, ttft_p90_s=ttft_p90, ttft_p99_s=ttft_p99,
        ttft_p50_late_s=late_ttft_p50(records),
        tbt_mean_s=_mean(tbt), tbt_p50_s=tbt_p50, tbt_p90_s=tbt_p90, tbt_p99_s=tbt_p99,
        tpot_p50_s=_pct(tpot, 50), tpot_p99_s=_pct(tpot, 99),
        e2e_p50_s=e2e_p50, e2e_p90_s=e2e_p90, e2e_p99_s=e2e_p99,
        request_throughput_rps=len(done) / duration_s,
        output_tokens_per_s=sum(r.num_output_tokens for r in done) / duration_s,
        prompt_tokens_per_s=sum(r.num_prompt_tokens for r in done) / duration_s,
        goodput_rps=met / duration_s, slo_attainment=met / len(records) if records else None,
        slo_ttft_s=slo.ttft_s, slo_tbt_s=slo.tbt_s, by_class=by_class)


def late_ttft_p50(records: list[RequestRecord]) -> float | None:
    """P50 TTFT of the later-arriving half of `records`; a request without a first token (failed,
    cut off) counts as infinitely late, so a half mostly unserved reads inf."""
    if not records:
        return None
    late = sorted(records, key=lambda r: r.arrival)[len(records) // 2:]
    ttfts = [r.ttft_s if r.finish_reason in FINISHED and r.ttft_s is not None else np.inf for r in late]
    return float(np.percentile(ttfts, 50, method="lower" if np.isinf(ttfts).any() else "linear"))


def _by_class(records: list[RequestRecord], met_each: list[bool], duration_s: float,
              pooled: tuple[float | None, float | None]) -> dict[str, dict[str, Any]]:
    """`pooled`: the whole run's (TTFT p50, TBT p99), which a run of a single class reuses."""
    groups: dict[str, list[tuple[RequestRecord, bool]]] = {}
    for r, met in zip(records, met_each):
        groups.setdefault(r.slo_class, []).append((r, met))
    out = {}
    for name, pairs in sorted(groups.items()):
        rs = [r for r, _ in pairs]
        met = sum(m for _, m in pairs)
        if len(groups) == 1:
            ttft_p50, tbt_p99 = pooled
        else:
            done = [r for r in rs if r.finish_reason in FINISHED]
            ttft_p50 = _pct([r.ttft_s for r in done if r.ttft_s is not None], 50)
            tbt_p99 = _pct(_gaps(done), 99)
        out[name] = {"num_requests": len(rs), "goodput_rps": met / duration_s, "slo_attainment": met / len(rs),
                     "ttft_p50_s": ttft_p50, "tbt_p99_s": tbt_p99}
    return out


def _gaps(done: list[RequestRecord]) -> np.ndarray:
    """Every request's gaps between consecutive tokens (RequestRecord.tbt_s), pooled in one array."""
    return np.concatenate([np.diff(r.token_times) for r in done]) if done else np.empty(0)


def class_lines(summary: Mapping[str, Any]) -> list[str]:
    """One human-readable line per SLO class, for runs that mix more than one (else none)."""
    by_class = summary.get("by_class") or {}
    if len(by_class) < 2:
        return []
    ms = lambda v: "-" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
    return [f"{name}: {c['num_requests']} requests, goodput {c['goodput_rps']:.3g} req/s, SLO attainment "
            f"{c['slo_attainment']:.1%}, TTFT p50 {ms(c['ttft_p50_s'])}, TBT p99 {ms(c['tbt_p99_s'])}"
            for name, c in by_class.items()]


def _tpot(r: RequestRecord) -> float | None:
    """From the output token count, not the number of timestamps: a streamed chunk may carry several."""
    if r.num_output_tokens < 2 or len(r.token_times) < 2:
        return None
    return (r.token_times[-1] - r.token_times[0]) / (r.num_output_tokens - 1)


def _pct(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _pcts(values, qs: tuple[float, ...]) -> list[float | None]:
    """Several percentiles of one list or array, with one conversion and one partition."""
    return [float(v) for v in np.percentile(values, qs)] if len(values) else [None] * len(qs)


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None
