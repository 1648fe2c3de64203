"""What a measured window is worth to the tuner (autotuner/objective.py)."""

from __future__ import annotations

import pytest

from autotuner.objective import score
from engine.slo_class import SloClass

SLO_ = SloClass(ttft_s=2.0, tbt_s=0.1)


def test_ties_go_to_the_configuration_whose_requests_queue_least():
    """Among configurations that serve every request, the one with the lowest P50 TTFT (queueing:
    capacity to spare) wins; a lower P99 TBT alone (smaller steps: less capacity) does not."""
    small_steps = score(5.0, 5.0, ttft_p50_s=0.8, tbt_p99_s=0.03, slo=SLO_)
    large_steps = score(5.0, 5.0, ttft_p50_s=0.2, tbt_p99_s=0.08, slo=SLO_)
    assert large_steps.value > small_steps.value
    assert score(5.0, 5.0, ttft_p50_s=0.2, tbt_p99_s=0.03, slo=SLO_).value == large_steps.value
    assert large_steps.feasible and small_steps.feasible


def test_goodput_share_outweighs_any_queueing_room():
    losing_one_in_twenty = score(4.75, 5.0, ttft_p50_s=0.0, tbt_p99_s=0.0, slo=SLO_)
    serving_all_near_the_bounds = score(5.0, 5.0, ttft_p50_s=1.9, tbt_p99_s=0.099, slo=SLO_)
    assert serving_all_near_the_bounds.value > losing_one_in_twenty.value


def test_constraints_are_the_latencies_over_their_bounds():
    result = score(1.0, 2.0, ttft_p50_s=2.5, tbt_p99_s=0.05, slo=SLO_)
    assert result.constraints == pytest.approx({"ttft_p50": 0.5, "tbt_p99": -0.05})
    assert not result.feasible
