"""Capacity search against fake probes with a planted capacity."""

from __future__ import annotations

import pytest

from loadgen.capacity import CapacityCriteria, probe_size, search_capacity
from telemetry.latency_summary import LatencySummary


def planted(capacity: float, calls: list[float] | None = None, failing_requests: bool = False):
    """TTFT blows up (or requests go unfinished) above `capacity` qps."""

    def probe(qps: float) -> dict:
        if calls is not None:
            calls.append(qps)
        over = qps > capacity
        return {"num_requests": 100, "num_finished": 90 if over and failing_requests else 100,
                "ttft_p50_s": 30.0 if over and not failing_requests else 0.3, "tbt_p99_s": 0.05}

    return probe


@pytest.mark.parametrize("capacity, start", [(3.7, 1.0), (3.7, 10.0), (0.3, 1.0), (17.0, 8.0)])
def test_finds_the_planted_capacity_within_tolerance(capacity, start):
    calls: list[float] = []
    result = search_capacity(planted(capacity, calls), CapacityCriteria(2.0, 0.25), start_qps=start,
                             max_probes=8, tolerance=0.05)
    assert len(result.probes) == len(calls) <= 8
    assert result.capacity_qps <= capacity < result.first_failing_qps
    assert result.first_failing_qps - result.capacity_qps <= 0.05 * result.first_failing_qps
    assert [p.qps for p in result.probes] == calls
    assert all(p.passed == (p.qps <= capacity) for p in result.probes)


def test_brackets_by_doubling_then_bisects():
    result = search_capacity(planted(3.7), start_qps=1.0, max_probes=8, tolerance=0.05)
    assert [p.qps for p in result.probes][:3] == [1.0, 2.0, 4.0]
    assert result.capacity_qps == pytest.approx(3.625)


def test_unfinished_requests_fail_a_probe():
    result = search_capacity(planted(3.7, failing_requests=True), CapacityCriteria(max_failed_fraction=0.05))
    assert result.capacity_qps <= 3.7 < result.first_failing_qps
    lenient = search_capacity(planted(3.7, failing_requests=True), CapacityCriteria(max_failed_fraction=0.2),
                              max_probes=3)
    assert lenient.first_failing_qps is None and lenient.capacity_qps == 4.0   # a lower bound only


def test_probe_budget_is_respected_and_nothing_passing_gives_zero():
    assert len(search_capacity(planted(1000.0), max_probes=3).probes) == 3
    short = search_capacity(planted(17.0), start_qps=0.5, max_probes=8)    # 7 probes to bracket
    assert len(short.probes) == 8 and short.capacity_qps <= 17.0 < short.first_failing_qps
    result = search_capacity(planted(0.0), start_qps=1.0, max_probes=4)
    assert result.capacity_qps == 0.0 and len(result.probes) == 4


def test_accepts_latency_summaries_and_validates():
    summary = LatencySummary(**{k: 0.1 for k in LatencySummary.__dataclass_fields__} | {
        "num_requests": 10, "num_finished": 10, "num_failed": 0})
    result = search_capacity(lambda qps: summary, max_probes=2)
    assert result.probes[0].summary["num_finished"] == 10 and result.as_dict()["capacity_qps"] == 2.0
    with pytest.raises(ValueError, match="max_probes"):
        search_capacity(planted(1.0), max_probes=0)
    with pytest.raises(ValueError, match="start_qps"):
        search_capacity(planted(1.0), start_qps=0)


@pytest.mark.parametrize("qps, num_requests, min_duration_s, expected", [
    (2.0, 100, 0.0, 100), (2.0, 100, 60.0, 120), (1.0, 100, 60.0, 100), (0.3, 5, 60.0, 18)])
def test_a_probe_spans_at_least_the_minimum_duration(qps, num_requests, min_duration_s, expected):
    assert probe_size(qps, num_requests, min_duration_s) == expected


def test_a_short_probe_passes_a_rate_a_sustained_one_fails():
    """60 chat requests queue within the TTFT bound at a rate far over what the CPU keeps up with;
    a minute of arrivals at that rate does not (the shipped AVX-512 calibration, simulated)."""
    from loadgen.workload import load_workload
    from policies import Knobs
    from simulation.cost_model_files import resolve_cost_model
    from simulation.workload_run import simulated_probe
    from engine.slo_class import SloClass

    cost = resolve_cost_model("configs/cost_models/smollm2-135m-instruct-fp32-quantized-cpu-avx512-bf16.json")
    criteria, workload = CapacityCriteria(), load_workload("chat")
    burst = simulated_probe(workload, cost, "sarathi", Knobs(token_budget=128), SloClass(), 60)
    sustained = simulated_probe(workload, cost, "sarathi", Knobs(token_budget=128), SloClass(), 60, min_duration_s=60)
    assert criteria.passes(burst(4.0).as_dict())
    assert not criteria.passes(sustained(4.0).as_dict())


def test_a_probe_whose_later_half_queues_past_the_bound_fails():
    """The whole probe's P50 TTFT within the bound does not pass a probe whose queue grew: the
    later-arriving half must meet it too (unless told otherwise, or a summary predates the field)."""
    falling_behind = {"num_requests": 200, "num_finished": 200, "ttft_p50_s": 1.8, "ttft_p50_late_s": 5.4,
                      "tbt_p99_s": 0.15}
    assert not CapacityCriteria().passes(falling_behind)
    assert CapacityCriteria(sustained=False).passes(falling_behind)
    assert CapacityCriteria().passes(falling_behind | {"ttft_p50_late_s": 1.9})
    assert CapacityCriteria().passes({k: v for k, v in falling_behind.items() if k != "ttft_p50_late_s"})


def test_the_later_half_counts_unserved_requests_as_never_served():
    from engine.outputs import RequestRecord
    from telemetry.latency_summary import late_ttft_p50

    def record(arrival: float, ttft: float | None) -> RequestRecord:
        first = None if ttft is None else arrival + ttft
        return RequestRecord(f"r{arrival}", arrival, first, arrival + 10, () if first is None else (first,), 10,
                             1, 1, "length" if first is not None else "abort", 0)

    steady = [record(t, 0.5) for t in range(8)]
    growing = [record(t, 0.2 * t) for t in range(8)]           # the later half waits 0.8-1.4 s
    assert late_ttft_p50(steady) == pytest.approx(0.5)
    assert late_ttft_p50(growing) == pytest.approx(1.1)         # median of 0.8, 1.0, 1.2, 1.4
    assert late_ttft_p50(list(reversed(growing))) == pytest.approx(1.1)   # by arrival, not list order
    cut_off = [record(t, 0.5) for t in range(5)] + [record(t, None) for t in range(5, 8)]
    assert late_ttft_p50(cut_off) == float("inf")             # 3 of the later 4 never got a token
    assert late_ttft_p50([]) is None
