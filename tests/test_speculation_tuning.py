"""The tuner over the speculation knobs: the shipped space names them, and `tune --simulate`, its
static grid and the zero-config matrix simulate the workload's drafts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from autotuner import simulated_tuning, warm_start
from autotuner.controller import ControllerSettings
from autotuner.search_space import load_search_space
from autotuner.warm_start import WarmStartJob
from autotuner.simulated_tuning import VLLM_DEFAULTS, RunResult, compare, static_grid
from autotuner.static_grid import grid_points, speculation_points
from engine.slo_class import SloClass
from loadgen.workload import generate, load_workload
from policies import Knobs
from policies.knobs import DAEMON_KNOBS
from simulation import workload_run
from simulation.cost_model import CostModel
from simulation.simulator import Simulator
from simulation.speculation_model import SpeculationModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import zero_config  # noqa: E402

COST = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
SLO_ = SloClass(ttft_s=2.0, tbt_s=0.25)
DRAFTS = SpeculationModel(match_rate=0.8, acceptance=0.7)


def test_the_shipped_space_tunes_the_most_drafts_and_the_acceptance_estimate():
    space = load_search_space()
    names = {r.name for r in space.ranges}
    assert {"speculative_tokens", "acceptance_prior", "acceptance_decay"} <= names
    assert space.snap({"speculative_tokens": 1})["speculative_tokens"] == 0       # one draft: off
    assert space.snap({"speculative_tokens": 5})["speculative_tokens"] == 5
    # what ties and thin evidence fall back to is what the daemon serves untold, not the library's knobs
    shipped = warm_start.shipped_defaults(space)
    assert {k: shipped[k] for k in DAEMON_KNOBS} == DAEMON_KNOBS


def test_the_static_grid_tries_each_speculation_setting_on_its_best_point(monkeypatch):
    """Without a drafter: the policy's grid, no drafts. With one: the grid at the daemon's speculation
    setting, then every other one on the grid's best point, each run with the drafter."""
    runs: list[tuple[Knobs, SpeculationModel | None]] = []

    def made_up(specs, cost, policy, knobs, slo, horizon, speculation=None) -> RunResult:
        runs.append((knobs, speculation))
        value = knobs.token_budget / 2048 + knobs.step_headroom + knobs.error_budget / 10
        return RunResult(value, 1.0, 0.0, 1.0, {})

    monkeypatch.setattr(simulated_tuning, "evaluate_static", made_up)
    space = load_search_space(max_token_budget=None)
    plain = static_grid([], COST, space, "deadline", SLO_)
    assert len(plain) == len(grid_points("deadline"))
    assert all(drafts is None for _, drafts in runs)
    assert {(k.speculative_tokens, k.speculative_mode, k.admission_slack) for k, _ in runs} == {(8, "adaptive", 1.0)}

    runs.clear()
    grid = static_grid([], COST, space, "deadline", SLO_, speculation=DRAFTS)
    base = len(grid_points("deadline"))
    assert len(grid) == base + len(speculation_points()) - 1          # the daemon's setting ran in the grid
    assert all(drafts is DRAFTS for _, drafts in runs)
    extra = [knobs for knobs, _ in runs[base:]]
    assert {(k.token_budget, k.step_headroom, k.error_budget) for k in extra} == {(2048, 1.0, 1.0)}
    assert {(k.speculative_tokens, k.speculative_mode) for k in extra} == {
        (0, "adaptive"), (2, "fixed"), (4, "fixed"), (8, "fixed"), (16, "adaptive")}


def test_tune_simulate_drafts_in_the_tuned_run_its_warm_start_and_its_grid(tmp_path, monkeypatch):
    """The tuned run's simulator, the warm start's searches and the tuned policy's static grid all draft
    as the workload's model says; vLLM's defaults, the baselines, do not draft."""
    built: list[Simulator] = []

    class Recorded(Simulator):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    searched: list[SpeculationModel | None] = []
    real_simulate = warm_start.simulate
    monkeypatch.setattr(workload_run, "Simulator", Recorded)
    monkeypatch.setattr(warm_start, "simulate", lambda *a, **k: searched.append(a[6]) or real_simulate(*a, **k))
    specs = generate(load_workload("chat"), qps=1.0, duration_s=120, seed=3)
    settings = ControllerSettings.load(policy="deadline", min_requests=10, min_tbt_samples=200, max_window_s=30.0,
                                       warm_start_trials=2, warm_start_enqueue=1)
    result = compare(specs, COST, str(tmp_path), SLO_, settings, ablation=False, speculation=DRAFTS)
    assert searched and set(map(id, searched)) == {id(DRAFTS)}
    drafting = [sim for sim in built if sim.drafter is not None]
    assert len(built) - len(drafting) == len(VLLM_DEFAULTS)
    grid_runs = len(grid_points("deadline")) + len(speculation_points()) - 1
    assert len(drafting) >= 1 + len(searched) + grid_runs
    assert "speculative_tokens" in result["best_static_knobs"]


def test_the_matrix_with_a_drafter_adds_a_start_that_always_verifies_eight():
    names = {s.name: s for s in zero_config.starts(speculation=True)}
    assert set(names) == {s.name for s in zero_config.starts()} | {"fixed-8"}
    fixed = names["fixed-8"].knobs
    assert (fixed.speculative_tokens, fixed.speculative_mode) == (8, "fixed")
    assert names["defaults"].knobs.speculative_tokens > 0            # the daemon drafts by default


def test_where_drafts_are_modelled_the_warm_start_tries_each_speculation_setting_first(monkeypatch):
    """Few TPE samples in a dozen dimensions seldom land on drafts off: with a drafter modelled, the
    grid's speculation lengths are among the enqueued candidates (on thin evidence, all that runs)."""
    tried: list[dict] = []

    def made_up(job, specs, params):
        tried.append(params)
        return SimpleNamespace(value=1.0 - params.get("speculative_tokens", 0) / 100, constraints={})

    monkeypatch.setattr(warm_start, "simulated_score", made_up)
    knobs = {k: v for k, v in Knobs(speculative_tokens=8, speculative_mode="fixed").as_dict().items() if k != "version"}
    lengths = [(100, 20, 0)] * 5                                   # thin: only the enqueued candidates run
    for drafts, lengths_tried in ((None, {8}), (DRAFTS, {0, 2, 4, 8, 16})):
        tried.clear()
        job = WarmStartJob(COST, load_search_space(), SLO_, "deadline", knobs, lengths, 1.0, 100, 2,
                           speculation=drafts)
        best = warm_start.search(job)
        assert {p["speculative_tokens"] for p in tried} == lengths_tried
    assert best[0]["speculative_tokens"] == 0
