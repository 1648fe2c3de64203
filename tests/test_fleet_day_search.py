"""benchmarks/fleet_day.py's search for the smallest static fleet that keeps the SLO target."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name

from fleet_day import static_for_peak  # noqa: E402


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
