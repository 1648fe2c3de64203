"""--load: a workload's rate as a share of the modelled machine's simulated capacity."""

from __future__ import annotations

import json

import pytest

from loadgen.capacity import CapacityCriteria
from loadgen.workload import generate, load_workload
from policies import Knobs
from serving.cli import main
from simulation.cost_model_files import SHIPPED_COST_MODEL, find_cost_model
from simulation.relative_load import base_rate, peak_phases, simulated_capacity
from simulation.workload_run import simulate
from engine.slo_class import SloClass

SLO_ = SloClass(ttft_s=2.0, tbt_s=0.25)


def summary_at(qps: float, workload, cost, slo: SloClass) -> dict:
    specs = generate(workload, qps=qps, num_requests=300, seed=0)
    return simulate(specs, cost, "deadline", Knobs(), slo).summary.as_dict()


def test_the_capacity_meets_the_slo_and_a_fifth_more_does_not():
    cost, slo, workload = find_cost_model(str(SHIPPED_COST_MODEL)), SLO_, load_workload("chat")
    capacity = simulated_capacity(workload, cost, slo)
    criteria = CapacityCriteria(slo.ttft_s, slo.tbt_s)
    assert criteria.passes(summary_at(capacity, workload, cost, slo))
    assert not criteria.passes(summary_at(1.2 * capacity, workload, cost, slo))
    assert 0.1 < capacity < 1.0          # the shipped 2-core CPU model: ~0.3 req/s of chat


def test_load_scales_the_capacity_and_qps_wins():
    cost, slo, workload = find_cost_model(str(SHIPPED_COST_MODEL)), SLO_, load_workload("chat")
    half = base_rate(workload, cost, slo, None, 0.5)
    default = base_rate(workload, cost, slo, None, None)
    assert half.capacity_qps == default.capacity_qps
    assert half.qps == pytest.approx(0.5 * half.capacity_qps) and default.qps == pytest.approx(0.8 * default.capacity_qps)
    assert base_rate(workload, cost, slo, 0.7, None).qps == 0.7
    with pytest.raises(ValueError, match="not both"):
        base_rate(workload, cost, slo, 0.7, 0.5)
    with pytest.raises(ValueError, match="--load must be > 0"):
        base_rate(workload, cost, slo, None, 0.0)


def test_simulate_runs_at_the_load_by_default(capsys):
    assert main(["simulate", "--profile", "h100-llama3.1-8b", "--workload", "chat", "--requests", "200",
                 "--slo-tbt-s", "0.05"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["load"] == 0.8 and out["qps"] == pytest.approx(0.8 * out["simulated_capacity_qps"], rel=1e-4)
    assert "of the simulated capacity" in captured.err
    assert main(["simulate", "--qps", "1", "--load", "0.5", "--requests", "5"]) == 2


def test_each_kind_of_traffic_is_probed_alone_at_its_peak_rate():
    """A day's peak hours and a shift's summarization phase set the capacity: probed as a whole,
    they were a few of a probe's requests, and 0.6 of that capacity overloaded the peak."""
    chat = load_workload("chat")
    assert peak_phases(chat) == [chat]
    (day,) = peak_phases(load_workload("diurnal"))             # 24 hours of one kind of traffic
    assert day.phases[0].rate == 1.0 and day.phases[0].arrival.process == "poisson"
    kinds = peak_phases(load_workload("shift"))                # chat-1 and chat-2 are one kind
    assert [(w.phases[0].lengths == load_workload("chat").phases[0].lengths, w.phases[0].rate) for w in kinds] \
        == [(True, 1.0), (False, 0.2)]


def test_the_hardest_kind_of_traffic_sets_the_capacity():
    cost, slo = find_cost_model(str(SHIPPED_COST_MODEL)), SloClass(ttft_s=10.0, tbt_s=0.25)
    shift = load_workload("shift")
    per_kind = [simulated_capacity(kind, cost, slo) for kind in peak_phases(shift)]
    assert simulated_capacity(shift, cost, slo) == min(per_kind)
    assert per_kind[1] < per_kind[0]      # summarization's long prompts, even at a fifth of the rate
