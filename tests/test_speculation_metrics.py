"""Speculative decoding's telemetry: the spec_decode Prometheus series and the window's draft fields, from
records with drafts (synthetic ones, then a speculating engine's own)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from engine.outputs import StepRecord
from engine.sampling_params import SamplingParams
from telemetry.prometheus import PrometheusMetrics
from telemetry.window import TelemetryWindow
from tests.conftest import assert_no_kv_leak, make_engine

BASE = StepRecord(0, 0.0, 0.02, 0, 4, 0, 4, 0, 0, 0.1, 40, 40, 4, 0.0, 0.02, 0.0, 0.0, "deadline", 0)
# (decodes, verifying decodes, drafted, kept): a step without drafts, then three that verified some
STEPS = [(4, 0, 0, 0), (4, 2, 6, 3), (4, 1, 4, 4), (2, 2, 2, 0)]


def record(i: int, decodes: int, seqs: int, drafted: int, kept: int) -> StepRecord:
    """A step of `decodes` decodes, `seqs` of them verifying `drafted` drafted tokens (decode rows too)."""
    return dataclasses.replace(BASE, step=i, start=float(i), num_decode_tokens=decodes + drafted,
                               num_running=decodes, num_sampled=decodes, draft_tokens=drafted,
                               kept_draft_tokens=kept, draft_seqs=seqs)


RECORDS = [record(i, *s) for i, s in enumerate(STEPS)]


def value(metrics: PrometheusMetrics, name: str) -> float:
    return metrics.registry.get_sample_value("autotuned:" + name, {"model_name": "m"}) or 0.0


@pytest.fixture
def metrics() -> PrometheusMetrics:
    metrics = PrometheusMetrics("m", registry=CollectorRegistry())
    for r in RECORDS:
        metrics.on_step(r)
    return metrics


def test_the_counters_sum_the_records_drafts(metrics):
    assert value(metrics, "spec_decode_num_drafts_total") == 5
    assert value(metrics, "spec_decode_num_draft_tokens_total") == 12
    assert value(metrics, "spec_decode_num_accepted_tokens_total") == 7
    assert value(metrics, "generation_tokens_total") == 14 + 7      # one sampled per decode, plus the kept drafts


def test_the_histograms_observe_only_steps_that_verified_drafts(metrics):
    assert value(metrics, "spec_decode_draft_tokens_per_step_count") == 3
    assert value(metrics, "spec_decode_draft_tokens_per_step_sum") == 12
    assert value(metrics, "spec_decode_accepted_tokens_per_draft_count") == 3
    assert value(metrics, "spec_decode_accepted_tokens_per_draft_sum") == pytest.approx(3 / 2 + 4 / 1 + 0 / 2)
    per_draft = metrics.registry.get_sample_value("autotuned:spec_decode_accepted_tokens_per_draft_bucket",
                                                  {"model_name": "m", "le": "0.0"})
    assert per_draft == 1       # the step that kept nothing


def test_without_drafts_no_series_moves():
    metrics = PrometheusMetrics("m", registry=CollectorRegistry())
    metrics.on_step(RECORDS[0])
    assert value(metrics, "spec_decode_num_drafts_total") == 0
    assert value(metrics, "spec_decode_draft_tokens_per_step_count") == 0
    assert value(metrics, "generation_tokens_total") == 4


def test_the_window_reads_acceptance_and_draft_lengths():
    window = TelemetryWindow(clock=lambda: 10.0)
    for r in RECORDS:
        window.on_step(r)
    w = window.window(10.0)
    assert (w.draft_tokens_per_s, w.kept_draft_tokens_per_s) == pytest.approx((1.2, 0.7))
    assert w.draft_acceptance_rate == pytest.approx(7 / 12)
    assert w.draft_tokens_per_verify == pytest.approx(12 / 5)
    assert w.draft_tokens_per_decode == pytest.approx(12 / 14)      # 14 decodes in all, 9 of them drafting nothing


def test_a_window_without_drafts_has_no_draft_ratios():
    window = TelemetryWindow(clock=lambda: 10.0)
    window.on_step(RECORDS[0])
    w = window.window(10.0)
    assert w.draft_tokens_per_s == 0 and w.draft_tokens_per_decode == 0
    assert w.draft_acceptance_rate is None and w.draft_tokens_per_verify is None
    assert TelemetryWindow(clock=lambda: 10.0).window(10.0).draft_tokens_per_decode is None


def test_a_speculating_engine_counts_what_its_records_say(tiny_hf):
    """The engine's own records, through the same listeners the daemon attaches (serving/daemon_telemetry.py)."""
    engine = make_engine(tiny_hf[0])
    metrics, window, records = PrometheusMetrics("m", registry=CollectorRegistry()), TelemetryWindow(), []
    engine.step_listeners += [metrics.on_step, window.on_step, records.append]
    engine.set_knobs(speculative_tokens=4, speculative_mode="fixed")
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outputs = []
    for prompt in ([5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [10, 11, 12, 13, 14, 10, 11, 12]):
        engine.add_request(prompt, params)
    while engine.has_unfinished():
        outputs += [o for o in engine.step() if o.finished]
    assert_no_kv_leak(engine)
    drafted = sum(r.draft_tokens for r in records)
    assert drafted > 0
    assert value(metrics, "spec_decode_num_draft_tokens_total") == drafted
    assert value(metrics, "spec_decode_num_accepted_tokens_total") == sum(r.kept_draft_tokens for r in records)
    assert value(metrics, "spec_decode_num_drafts_total") == sum(r.draft_seqs for r in records)
    assert value(metrics, "generation_tokens_total") == sum(len(o.token_ids) for o in outputs) == 96
    w = window.window(600.0)
    assert 0 < w.draft_tokens_per_verify <= 4 and w.draft_tokens_per_decode <= w.draft_tokens_per_verify
