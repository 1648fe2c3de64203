"""The simulator warm start's choice of configurations to try first."""

from __future__ import annotations

import optuna

from autotuner.controller import ControllerSettings
from autotuner.search_space import load_search_space
from autotuner.sim_tuning import tune_on_simulator
from autotuner.warm_start import best_configurations, slo_token_budget
from autotuner.workload import generate, load_workload
from engine.cost_model import CostModel
from telemetry.window import SLO


def study_with(results: list[tuple[int, float, float]]) -> optuna.Study:
    """One trial per (token_budget, value, TBT excess over the SLO)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    dists = {"token_budget": optuna.distributions.IntDistribution(32, 2048, step=32)}
    for budget, value, excess in results:
        study.enqueue_trial({"token_budget": budget})
        trial = study.ask(dists)
        trial.set_constraint("tbt", excess)
        study.tell(trial, value)
    return study


def test_feasible_configurations_come_first_best_value_first():
    study = study_with([(64, 0.5, 0.0), (512, 0.9, 0.3), (128, 0.8, -0.1), (256, 0.7, 0.0)])
    chosen = best_configurations(study, load_search_space(), keep=2)
    assert [c["token_budget"] for c in chosen] == [128, 256]


def test_without_a_feasible_configuration_the_nearest_misses_are_tried():
    study = study_with([(64, 0.1, 0.4), (512, 0.3, 1.5), (128, 0.2, 0.05)])
    chosen = best_configurations(study, load_search_space(), keep=2)
    assert [c["token_budget"] for c in chosen] == [128, 64]


def test_cold_start_budget_is_the_largest_chunk_within_the_tbt_slo():
    """Linear cost 10 ms + 1 ms/token: under a 0.2 s bound with 15% headroom (0.17 s) the largest
    32-multiple whose chunk fits is 160 (0.17 s); with no budget fitting, the lowest."""
    cost = CostModel((0.01, 1e-3, 0.0, 0.0, 0.0, 0.0, 0.0))
    space = load_search_space()
    assert slo_token_budget(cost, SLO(2.0, 0.2), space, 0.15) == 160
    assert slo_token_budget(cost, SLO(2.0, 0.01), space, 0.15) == 32
    assert slo_token_budget(cost, SLO(2.0, 100.0), space, 0.15) == 2048


def test_simulated_controller_warm_starts_in_process(tmp_path):
    """tune --simulate: the warm start's configurations are the regime's first trials."""
    cost = CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)
    specs = generate(load_workload("chat"), qps=1.0, duration_s=240, seed=3)
    settings = ControllerSettings.load(policy="adaptive", min_requests=10, min_tbt_samples=200, max_window_s=30.0,
                                       warm_start_trials=4, warm_start_enqueue=2)
    controller, _, _ = tune_on_simulator(specs, cost, str(tmp_path), SLO(2.0, 0.25), settings)
    assert [t.user_attrs.get("source") for t in controller.study.trials][:2] == ["warm-start", "warm-start"]
