"""Replicas sharing one Optuna storage (docs/cluster.md): a new replica sees the regimes and trials
the others recorded, concurrent writers lose nothing, and a replica's restart fails only the
trials it left running, never one another replica is measuring."""

from __future__ import annotations

import multiprocessing

import optuna
from optuna.trial import TrialState

from autotuner.regime import Regime
from autotuner.tuner_state import TunerState

optuna.logging.set_verbosity(optuna.logging.WARNING)
DIST = {"x": optuna.distributions.FloatDistribution(0, 1)}


def regime() -> Regime:
    return Regime(io_ratio_bucket=1, rate_bucket=0, kv="low")


def test_a_new_replica_starts_from_what_the_others_learned(tmp_path):
    storage = f"journal:{tmp_path / 'shared' / 'tuner.journal'}"
    first = TunerState(tmp_path / "replica-0", storage=storage, owner="replica-0")
    _, study = first.study_for(regime(), (1.0, 0.0, 0.0))
    trial = study.ask(DIST)
    study.tell(trial, 0.5)
    newcomer = TunerState(tmp_path / "replica-1", storage=storage, owner="replica-1")
    assert newcomer.regimes() == first.regimes()
    _, seen = newcomer.study_for(regime(), (1.1, 0.0, 0.0))      # near the known regime: its study
    assert [t.value for t in seen.trials] == [0.5]
    assert not (tmp_path / "replica-1" / "tuner.db").exists()   # only the decisions log is per replica


def test_a_restart_fails_only_its_own_running_trials(tmp_path):
    storage = f"journal:{tmp_path / 'tuner.journal'}"
    states = {name: TunerState(tmp_path / name, storage=storage, owner=name) for name in ("replica-0", "replica-1")}
    running = {}
    for name, state in states.items():
        study = state.study(regime())
        trial = study.ask(DIST)
        state.claim(trial)
        running[name] = trial.number
    restarted = TunerState(tmp_path / "replica-1", storage=storage, owner="replica-1")
    assert restarted.recovered == 1
    trials = {t.number: t.state for t in restarted.study(regime()).trials}
    assert trials[running["replica-0"]] == TrialState.RUNNING    # still being measured by replica-0
    assert trials[running["replica-1"]] == TrialState.FAIL


def _write_trials(storage: str, owner: str, count: int) -> None:
    state = TunerState(f"{storage.removeprefix('journal:')}.{owner}", storage=storage, owner=owner)
    study = state.study(regime())
    for _ in range(count):
        trial = study.ask(DIST)
        state.claim(trial)
        study.tell(trial, 1.0)


def test_concurrent_writers_lose_no_trial(tmp_path):
    storage = f"journal:{tmp_path / 'tuner.journal'}"
    TunerState(tmp_path / "setup", storage=storage).study(regime())   # the study exists before the race
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_write_trials, args=(storage, f"replica-{i}", 15)) for i in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    trials = TunerState(tmp_path / "check", storage=storage).study(regime()).trials
    assert len(trials) == 45 and all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.number for t in trials}) == 45
    assert {t.user_attrs["owner"] for t in trials} == {"replica-0", "replica-1", "replica-2"}
