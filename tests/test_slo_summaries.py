"""Goodput and SLO attainment per SLO class, in run summaries and telemetry windows (hand-built records)."""

from __future__ import annotations

import pytest

from engine.outputs import RequestRecord
from telemetry.latency_summary import class_lines, summarize_requests
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow

SLO_ = SloClass(ttft_s=2.0, tbt_s=0.25)


def record(i: int, cls: str, ttft: float, gap: float = 0.1, reason: str = "length",
           targets: tuple[float, float] | None = None) -> RequestRecord:
    """Arrives at i, first token after `ttft`, three more tokens `gap` apart."""
    times = tuple(i + ttft + k * gap for k in range(4))
    return RequestRecord(str(i), float(i), times[0], times[-1], times, 10, 4, 4, reason, 0, cls,
                         *(targets or (None, None)))


BATCH = (30.0, 2.0)
RECORDS = [
    record(0, "interactive", 1.0),                    # met
    record(1, "interactive", 3.0),                    # TTFT over the run's 2 s
    record(2, "interactive", 0.5, gap=0.5),           # TBT over 0.25 s
    record(3, "batch", 10.0, gap=1.0, targets=BATCH),  # met only by its own class's targets
    record(4, "batch", 40.0, targets=BATCH),          # TTFT over even batch's 30 s
    record(5, "batch", 1.0, reason="abort", targets=BATCH),
]


def test_latency_summary_by_class():
    s = summarize_requests(RECORDS, SLO_, duration_s=10.0)
    assert s.goodput_rps == pytest.approx(0.2) and s.slo_attainment == pytest.approx(2 / 6)
    assert set(s.by_class) == {"interactive", "batch"}
    i, b = s.by_class["interactive"], s.by_class["batch"]
    assert (i["num_requests"], i["goodput_rps"], i["slo_attainment"]) == (3, pytest.approx(0.1), pytest.approx(1 / 3))
    assert (b["num_requests"], b["goodput_rps"], b["slo_attainment"]) == (3, pytest.approx(0.1), pytest.approx(1 / 3))
    assert i["ttft_p50_s"] == pytest.approx(1.0) and b["ttft_p50_s"] == pytest.approx(25.0)  # aborted: not counted
    assert i["tbt_p99_s"] == pytest.approx(0.5, rel=0.01) and b["tbt_p99_s"] == pytest.approx(1.0, rel=0.01)
    assert s.as_dict()["by_class"] == s.by_class
    lines = class_lines(s.as_dict())
    assert len(lines) == 2 and lines[0].startswith("batch: 3 requests") and "33.3%" in lines[0]
    assert class_lines(summarize_requests(RECORDS[:3], SloClass(), 10.0).as_dict()) == []   # one class: no lines


def test_window_summary_by_class():
    window = TelemetryWindow(SLO_, clock=lambda: 50.0)
    for r in RECORDS:      # all finish within [0, 50)
        window.on_finish(r)
    w = window.window(50.0)
    assert w.goodput_by_class == {"interactive": pytest.approx(1 / 50), "batch": pytest.approx(1 / 50)}
    assert w.slo_attainment_by_class == {"interactive": pytest.approx(1 / 3), "batch": pytest.approx(1 / 3)}
    assert w.goodput_rps == pytest.approx(2 / 50)
    late = window.window(10.0)     # only the batch request that missed its TTFT finished in [40, 50)
    assert late.goodput_by_class == {"batch": 0.0} and late.slo_attainment_by_class == {"batch": 0.0}


def test_the_tuner_scores_a_mixed_window_by_class_weights_and_the_default_class_latency():
    from autotuner.objective import score_window
    window = TelemetryWindow(SLO_, clock=lambda: 60.0)
    for r in RECORDS[:5]:                  # interactive: 1 of 3 met; batch: 1 of 2
        window.on_finish(r)
    summary = window.window(60.0)
    assert summary.finished_by_class == {"interactive": 3, "batch": 2}
    assert summary.tbt_p99_by_class["interactive"] == pytest.approx(0.5, abs=0.02)   # not batch's 1 s gaps
    summary = summary.__class__(**(vars(summary) | {"num_arrivals": 6, "arrival_rate_rps": 0.1}))
    headroom = 0.01 * (1 - 1.0 / 2.0)              # interactive P50 TTFT 1 s: its queueing room
    even = score_window(summary, SLO_, {"interactive": 1.0, "batch": 1.0}, "interactive")
    batch_heavy = score_window(summary, SLO_, {"interactive": 1.0, "batch": 3.0}, "interactive")
    assert even.value == pytest.approx(2 / 5 * 5 / 6 + headroom, abs=1e-3)      # attainment x finished share
    assert batch_heavy.value == pytest.approx(4 / 9 * 5 / 6 + headroom, abs=1e-3)
    assert even.constraints["tbt_p99"] == pytest.approx(0.25, abs=0.02)           # the interactive class's
