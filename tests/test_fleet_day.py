"""benchmarks/fleet_day.py: its search for the smallest static fleet that keeps the SLO target, and
how it stores a day's timelines."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name

from fleet_day import MAX_POINTS, compact, following, static_for_peak  # noqa: E402


def runner(smallest_keeping: int):
    ran: list[int] = []

    def run(n: int):
        ran.append(n)
        return SimpleNamespace(attainment=1.0 if n >= smallest_keeping else 0.9)
    return run, ran


@pytest.mark.parametrize("smallest", [1, 5, 8, 9, 10, 13, 21, 50])
def test_the_search_finds_the_smallest_keeping_fleet_running_each_size_once(smallest):
    run, ran = runner(smallest)
    runs = static_for_peak(run, peak=8, high=50, slo_target=0.99)
    assert min(n for n, r in runs.items() if r.attainment >= 0.99) == smallest
    assert smallest - 1 in runs or smallest == 1                 # its neighbour below was seen to miss
    assert len(ran) == len(set(ran)) and max(ran) <= 50
    assert max(ran) < 2 * max(smallest, 8)                       # no run far above what was needed


def test_no_fleet_up_to_the_bursts_count_keeps_it():
    run, ran = runner(99)
    runs = static_for_peak(run, peak=8, high=20, slo_target=0.99)
    assert max(runs) == 20 and all(r.attainment < 0.99 for r in runs.values())


def test_a_long_days_timelines_are_pooled_keeping_their_peaks_and_the_following_bound():
    n = 4 * MAX_POINTS + 3
    fleet = [{"t": 10.0 * i, "rate_rps": 1.0, "serving": 2 + (i == 1234) * 30, "starting": 0, "draining": 0}
             for i in range(n)]
    curve = [[5 * i, 3.0 + (i == 777) * 10.0 + 1e-7] for i in range(2 * n)]
    plan = [{"t": 1.0, "reason": "hold", "target": 2}, {"t": 2.123456789, "reason": "up", "target": 3}]
    r = {"capacity": {"rate_rps": 2.0}, "timeline": {"planner": fleet, "ray_default": fleet, "rate_curve": curve},
         "plan": plan}
    bound = following(r)
    stored = compact(r)
    assert stored["following_mean_replicas"] == following(stored) == bound
    assert all(len(v) <= MAX_POINTS for v in stored["timeline"].values())
    assert max(p["serving"] for p in stored["timeline"]["planner"]) == 32
    assert max(v for _, v in stored["timeline"]["rate_curve"]) == 13.0
    assert stored["plan"] == [{"t": 2.1235, "reason": "up", "target": 3}]


def test_a_compressed_days_timelines_are_kept_whole():
    fleet = [{"t": 10.0 * i, "rate_rps": 1.0, "serving": 2, "starting": 0, "draining": 0} for i in range(72)]
    r = {"capacity": {"rate_rps": 2.0}, "plan": [],
         "timeline": {"planner": fleet, "ray_default": [], "rate_curve": [[5 * i, 3.0] for i in range(144)]}}
    assert compact(r)["timeline"]["planner"] == fleet and len(compact(r)["timeline"]["rate_curve"]) == 144
