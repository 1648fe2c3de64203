"""benchmarks/zero_config.py's bins after convergence: over every request finishing after it, and over
the requests that arrived after it (the first bin also holds requests the wrong start admitted)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the scripts import by name
import render_zero_config as render  # noqa: E402
import wrong_start_live  # noqa: E402
import zero_config  # noqa: E402

from autotuner.simulated_tuning import violating_bin_fraction  # noqa: E402
from autotuner.targets import ConfigurationChange  # noqa: E402
from engine.outputs import RequestRecord  # noqa: E402
from engine.slo_class import SloClass  # noqa: E402
from policies import Knobs  # noqa: E402

SLO = SloClass(ttft_s=2.0, tbt_s=0.1)


def record(index: int, arrival: float, gap: float) -> RequestRecord:
    """Simulator request `sim-<index>`: first token 0.05 s after arrival, then two tokens `gap` apart."""
    first = arrival + 0.05
    return RequestRecord(f"sim-{index}", arrival, first, first + 2 * gap, (first, first + gap, first + 2 * gap),
                         10, 3, 3, "length", 0)


def test_the_first_bin_after_convergence_counts_a_wrong_starts_request_only_over_every_finish():
    # sim-0 arrived under the wrong start (5-s token gaps) and finishes in the first bin after 60 s
    records = [record(0, 50.0, 5.0), record(1, 65.0, 0.05), record(2, 70.0, 0.05), record(3, 95.0, 0.05)]
    assert violating_bin_fraction(records, SLO, 30.0, 60.0) == 0.5
    new = zero_config.arrived_from(records, 60.0)
    assert [r.request_id for r in new] == ["sim-1", "sim-2", "sim-3"]
    assert violating_bin_fraction(new, SLO, 30.0, 60.0) == 0.0


def cell(**violating: float) -> dict:
    return {"start": "prefill-first-8192", "tuned_over_best_static": 0.9, "convergence_s": 60.0,
            "after_convergence_over_best_static": 1.0, "violating_bins_after_convergence": 0.05,
            "best_static_violating_bins_after_convergence": 0.0, **violating}


def test_goodput_windows_hold_100_arrivals_counted_where_the_rate_drops():
    """30-s bins: a busy phase (40 arrivals a bin), one at a fifth of it (8), busy again. A window is
    >= 120 s and holds >= 100 arrivals: 4 bins in the busy phase, 12-13 across the slow one (sized
    by the mean rate it held ~20 there, where one request lost is 5%); none past the run's end."""
    arrivals = np.array([40] * 6 + [8] * 12 + [40] * 6)
    ends = zero_config.window_ends(arrivals, 30.0)
    assert ends[0] == 4 and ends[5] == 5 + 1 + 8           # 40 + 8 x 8 + ... reaches 100 in bin 13
    assert all(arrivals[i:end].sum() >= 100 and end - i >= 4 for i, end in enumerate(ends))
    assert len(ends) == len(arrivals) - 3                  # the last three windows would run past the end
    # one request lost in every slow bin: a window from bin 11 loses 7 of 136 (> 5%), from bin 12 on at
    # most 6 of 128 (4.7%); 4-bin windows (120 s) would have lost 4 of 32 until bin 18
    good, best = arrivals.astype(float) - np.isin(np.arange(24), range(6, 18)), arrivals.astype(float)
    assert zero_config.convergence_bin(good, best, ends) == 12
    assert zero_config.convergence_bin(best, best, ends) == 0


def test_a_run_has_not_converged_while_it_holds_a_start_that_loses():
    """The A100's diurnal from sarathi-32 (the zero-config matrix): the tuned run left the start at 60.1 s, and a
    dawn window of 100 arrivals absorbed the 4 of 9 requests it lost in the 30-60 s bin, so the goodput
    windows alone called it converged at 30 s. A start that held serves >= 0.95x may converge at 0."""
    moved = [ConfigurationChange(60.1, "deadline", Knobs())]
    assert zero_config.earliest_convergence_bin(moved, start_loses=True, bin_s=30.0) == 3
    assert zero_config.earliest_convergence_bin([ConfigurationChange(0.0, "deadline", Knobs())], True, 30.0) == 0
    assert zero_config.earliest_convergence_bin(moved, start_loses=False, bin_s=30.0) == 0
    assert zero_config.earliest_convergence_bin([], start_loses=True, bin_s=30.0) is None
    arrivals = np.array([11, 9] + [12] * 20)
    best = arrivals.astype(float)
    tuned = best - np.array([2, 4] + [0] * 20)                                # lost under the start
    ends = zero_config.window_ends(arrivals, 30.0)
    assert zero_config.convergence_bin(tuned, best, ends) == 1                 # the window absorbs bin 1
    assert zero_config.convergence_bin(tuned, best, ends, earliest=3) == 3


def test_the_matrix_judges_by_new_arrivals_where_a_cell_records_them_and_shows_both():
    old = cell()
    assert not render.meets(old) and render.cell_text(old).endswith("5% (0%) ✗")
    new = cell(violating_bins_after_convergence_new_arrivals=0.0,
               best_static_violating_bins_after_convergence_new_arrivals=0.0)
    assert render.meets(new)
    assert render.cell_text(new) == "1.000 / 60 s / 0% (0%) [5% with earlier arrivals]"
    same = cell(violating_bins_after_convergence_new_arrivals=0.05,
                best_static_violating_bins_after_convergence_new_arrivals=0.0)
    assert render.cell_text(same) == "1.000 / 60 s / 5% (0%) ✗"


def test_a_cell_that_never_converged_fails_the_bars_and_renders():
    """zero_config.py records no bin share where tuned never converged (the A100's diurnal day)."""
    cell = {"start": "defaults", "tuned_over_best_static": 0.965, "after_convergence_over_best_static": None,
            "convergence_s": None, "violating_bins_after_convergence": None}
    assert render.violating(cell) == (None, None)
    assert not render.meets(cell) and not render.meets(cell, strict=False)
    assert render.cell_text(cell) == "0.965 / never"


def test_runs_carry_over_only_from_a_run_on_the_same_requests(tmp_path):
    """wrong_start_live.py --carry-from: a start's runs (tuned, left alone) not made in this run are
    taken from an earlier run on the same requests, marked with where they came from; what this run
    made is kept, and a run the earlier one carried keeps its own origin."""
    older = {"file": "old.json", "commit": "aaaaaaa1", "date_utc": "2026-11-27T20:08:12Z"}
    earlier = {"meta": {"commit": "e416e3115b", "date_utc": "2026-11-27T22:50:00Z"}, "qps": 1.5, "duration_s": 480.0,
               "num_requests": 683, "slo": {"ttft_s": 2.0, "tbt_s": 0.25},
               "command": "python benchmarks/wrong_start_live.py --qps 1.5 --duration 480",
               "results": {"sarathi-32": {"controller": {}, "slo_attainment": 0.6,
                                          "left_alone": {"slo_attainment": 0.086, "carried_from": older}},
                           "prefill-first-8192": {"controller": {}, "slo_attainment": 0.9,
                                                  "left_alone": {"slo_attainment": 0.46}}}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    args = argparse.Namespace(qps=1.5, duration=480.0, seed=0, slo_ttft_s=2.0, slo_tbt_s=0.25)
    results = {"defaults": {"left_alone": {"slo_attainment": 0.95}},
               "prefill-first-8192": {"controller": {}, "slo_attainment": 0.97}}
    wrong_start_live.carry_over(results, str(path), args, 683)
    assert results["sarathi-32"]["slo_attainment"] == 0.6 and results["sarathi-32"]["carried_from"]["commit"] == "e416e3115b"
    assert results["sarathi-32"]["left_alone"]["carried_from"] == older          # carried before: its origin
    assert results["prefill-first-8192"]["slo_attainment"] == 0.97                # run here: kept
    assert "carried_from" not in results["prefill-first-8192"]
    assert results["prefill-first-8192"]["left_alone"]["carried_from"]["commit"] == "e416e3115b"
    assert "carried_from" not in results["defaults"]["left_alone"]
    assert "(earlier run, at aaaaaaa)" in render._left_alone(results["sarathi-32"]["left_alone"] | {
        "bins_met": [True, False], "goodput_rps": 0.1})
    with pytest.raises(SystemExit, match="not a run on the same requests"):
        wrong_start_live.carry_over({}, str(path), argparse.Namespace(**vars(args) | {"seed": 3}), 683)


def test_a_named_start_is_read_from_the_command_line():
    assert wrong_start_live.parse_start("pick=deadline:token_budget=2048,step_headroom=1.0") == \
        ("pick", ("deadline", {"token_budget": 2048, "step_headroom": 1.0}))
    for bad in ("pick", "pick=deadline:token_budget", "=deadline:token_budget=1", "pick=deadline:token_budget=x"):
        with pytest.raises(ValueError):
            wrong_start_live.parse_start(bad)


def test_a_stored_calibration_seeds_each_daemons_state_dir(tmp_path):
    """wrong_start_live.py --cost-model: every daemon's fresh state dir holds that calibration where the
    daemon's start-up looks for one (so it serves on it instead of calibrating); without it, none."""
    from simulation.cost_model_files import SHIPPED_COST_MODEL, state_dir_calibrations

    seeded = wrong_start_live.seeded_state_dir(str(tmp_path / "a"), str(SHIPPED_COST_MODEL))
    [found] = state_dir_calibrations(seeded)
    assert found.read_bytes() == SHIPPED_COST_MODEL.read_bytes()
    assert state_dir_calibrations(wrong_start_live.seeded_state_dir(str(tmp_path / "b"), None)) == []
