"""The queue model of a replica (cluster/queue_replica.py): its timings by hand, its order, its
fit to a capacity profile, and a fleet day run on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cluster.fleet_run import DayRun
from cluster.fleet_scalers import StaticScaler
from cluster.replica_capacity import LatencyPoint, ReplicaCapacity
from engine.slo_class import SloClass, SloClasses
from loadgen.fleet_traffic import Burst, DiurnalShape, RateCurve
from loadgen.workload import RequestSpec, parse_workload
from cluster.queue_replica import QueueModel, QueueReplica, fit_queue_model

CLASSES = SloClasses({"interactive": SloClass("interactive", 2.0, 0.25), "batch": SloClass("batch", 30.0, 2.0)},
                     "interactive")
# 1000-token prompts at 0.1 ms a token (0.1 s of prefill), lone TTFT 0.2 s, 10 ms per output token
CAPACITY = ReplicaCapacity(4.0, 1000, 100, 0.0, 1e-4, 1e-3,
                           (LatencyPoint(0.25, 0.2, 0.01), LatencyPoint(1.0, 0.5, 0.03)))


def replica(decode_share: float = 0.5) -> tuple[QueueReplica, list]:
    r = QueueReplica(QueueModel(CAPACITY, decode_share, CLASSES))
    records: list = []
    r.finish_listeners.append(records.append)
    return r, records


def spec(t: float, prompt: int = 1000, output: int = 101, slo_class: str | None = None) -> RequestSpec:
    return RequestSpec(t, prompt, output, "test", slo_class)


def test_a_lone_request_takes_the_profiles_lone_ttft_then_decodes_at_its_tpot():
    r, records = replica()
    r.submit([spec(1.0, prompt=2000)])
    r.run_until(100)
    (record,) = records
    assert record.ttft_s == pytest.approx(0.4)                 # 0.2 s at 1000 tokens, scaled by the prompt
    assert record.tpot_s == pytest.approx(0.01)                # the profile's lowest load (held below it)
    assert record.finished == pytest.approx(1.4 + 100 * 0.01)
    assert record.slo_class == "interactive" and (record.slo_ttft_s, record.slo_tbt_s) == (2.0, 0.25)
    assert r.done and r.now == 100


def test_prompts_queue_behind_each_other_at_the_prefill_rate_decoding_leaves():
    """Ten 10,000-token prompts at once (1 s of prefill each at the full rate): each waits for those
    before it, and the wait grows with the decode share the load takes."""
    ttfts = {}
    for share in (0.0, 0.5):
        r, records = replica(share)
        r.submit([spec(0.0, prompt=10_000) for _ in range(10)])
        r.run_until(math.inf)
        ttfts[share] = sorted(rec.ttft_s for rec in records)
    assert ttfts[0.0] == pytest.approx([float(i) for i in range(2, 12)])   # lone 2 s, then 1 s more each
    assert ttfts[0.5][-1] > ttfts[0.0][-1]


def test_the_most_urgent_request_goes_first():
    """A batch request (TTFT target 30 s) waiting beside an interactive one that arrived later: the
    interactive one's deadline is earlier, so it starts first."""
    r, records = replica(0.0)
    r.submit([spec(0.0, prompt=10_000), spec(0.1, slo_class="batch"), spec(0.2)])
    r.run_until(math.inf)
    first = {rec.slo_class + str(rec.num_prompt_tokens): rec.first_token for rec in records}
    assert first["interactive1000"] < first["batch1000"]


def test_load_counts_waiting_and_running_work_until_each_finishes():
    r, _ = replica(0.0)
    r.submit([spec(0.0, prompt=10_000, output=11), spec(0.0, prompt=10_000, output=11), spec(50.0)])
    r.run_until(0.5)          # the first has begun (1 s of prefill), the second waits, the third is to come
    load = r.load
    assert (load.queued_tokens, load.running_tokens, load.ongoing) == (10_011 + 1101, 10_011, 3)
    r.run_until(10.0)
    assert (r.load.queued_tokens, r.load.running_tokens, r.load.ongoing) == (1101, 0, 1)


def test_the_fit_keeps_the_slo_target_at_the_profiled_capacity_and_no_more():
    workload = parse_workload("w", {"phases": [{"name": "chat", "arrival": "poisson", "lengths": {
        "kind": "lognormal", "prompt": {"mean": 1000, "sigma": 0.9, "min": 16, "max": 8000},
        "output": {"mean": 100, "sigma": 0.5, "min": 8, "max": 400}}}]})
    capacity = ReplicaCapacity(6.0, 1000, 100, 0.0, 1e-4, 1e-3,
                               (LatencyPoint(0.25, 0.2, 0.01), LatencyPoint(1.0, 0.5, 0.03)))
    model = fit_queue_model(capacity, workload, slo_target=0.99)
    assert 0.0 < model.decode_share < 0.95
    from cluster.capacity_profile import at_rate
    from loadgen.workload import generate
    specs = at_rate(generate(workload, num_requests=540, seed=0), capacity.rate_rps)

    def attainment(share: float) -> float:
        r, records = QueueReplica(QueueModel(capacity, share, model.slo_classes)), []
        r.finish_listeners.append(records.append)
        r.submit(specs)
        r.run_until(math.inf)
        return sum(rec.ttft_s <= 2.0 for rec in records) / len(records)

    assert attainment(model.decode_share) >= 0.99 > attainment(model.decode_share + 0.01)


def test_a_fleet_day_runs_on_queue_replicas():
    model = QueueModel(CAPACITY, 0.5, CLASSES)
    run = DayRun(lambda: QueueReplica(model), StaticScaler(2), startup_s=30)
    day = [spec(i / 6.0) for i in range(600)]            # 100 s at 6 requests/s: 0.75 of two replicas
    result = run.run(day, duration_s=100)
    assert result.requests == 600 and result.attainment == 1.0
    assert {name for name, _ in run.fleet.finished} == {"replica-0", "replica-1"}
    assert result.replica_seconds == pytest.approx(2 * result.duration_s)


def test_a_bad_queue_model_fails_with_one_line():
    with pytest.raises(ValueError, match="queue model: needs 0 <= decode_share < 1"):
        QueueModel(CAPACITY, 1.0, CLASSES)
    with pytest.raises(ValueError, match="capacity profile with latencies"):
        QueueModel(ReplicaCapacity.measured(3.0), 0.5, CLASSES)


def test_the_vectorized_rate_curve_is_the_rate():
    curve = RateCurve.draw(DiurnalShape(peak_rps=40, day_s=900, noise_period_s=30, bursts_per_day=2,
                                        burst_length_s=(20, 60)), seed=4)
    curve = RateCurve(curve.shape, curve.noise, curve.bursts + (Burst(100, 50, 3.0),))
    times = np.linspace(0, 899.9, 3001)
    assert curve.rates(times) == pytest.approx([curve.rate(t) for t in times])
