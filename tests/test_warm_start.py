"""The simulator warm start's choice of configurations to try first."""

from __future__ import annotations

import optuna

from autotuner.search_space import load_search_space
from autotuner.warm_start import SimulatorWarmStart, slo_token_budget
from engine.cost_model import CostModel
from policies import Knobs
from telemetry.window import SLO


def warm_start(keep: int) -> SimulatorWarmStart:
    space = load_search_space()
    return SimulatorWarmStart(cost=lambda: None, space=space, slo=SLO(), policy="adaptive", base_knobs=Knobs,
                              samples=lambda seconds: [], trials=0, keep=keep)


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
    chosen = warm_start(keep=2)._best(study)
    assert [c["token_budget"] for c in chosen] == [128, 256]


def test_without_a_feasible_configuration_the_nearest_misses_are_tried():
    study = study_with([(64, 0.1, 0.4), (512, 0.3, 1.5), (128, 0.2, 0.05)])
    chosen = warm_start(keep=2)._best(study)
    assert [c["token_budget"] for c in chosen] == [128, 64]


def test_cold_start_budget_is_the_largest_chunk_within_the_tbt_slo():
    """Linear cost 10 ms + 1 ms/token: under a 0.2 s bound with 15% headroom (0.17 s) the largest
    32-multiple whose chunk fits is 160 (0.17 s); with no budget fitting, the lowest."""
    cost = CostModel((0.01, 1e-3, 0.0, 0.0, 0.0, 0.0, 0.0))
    space = load_search_space()
    assert slo_token_budget(cost, SLO(2.0, 0.2), space, 0.15) == 160
    assert slo_token_budget(cost, SLO(2.0, 0.01), space, 0.15) == 32
    assert slo_token_budget(cost, SLO(2.0, 100.0), space, 0.15) == 2048
