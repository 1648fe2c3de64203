"""The daemon's sampler for its live studies: Optuna's TPE, with its costly part (the multivariate
sample over the regime's past trials; ~40 ms an ask at 70 trials on the 2-core dev VM, growing with
the trials) in a background process, so the tuner's thread does not hold the serving process's
GIL for it at each window. Imports no torch: the child starts in well under a second."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, TPESampler
from optuna.study import Study, StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotuner.background import BackgroundRunner


@dataclass(frozen=True)
class SampleJob:
    directions: list[StudyDirection]
    trials: list[FrozenTrial]                 # the study's completed ones
    space: dict[str, BaseDistribution]
    n_startup_trials: int
    seed: int


def sample(job: SampleJob) -> dict[str, Any]:
    """TPE's sample of `space` after `trials`, from an in-memory copy of the study. One process asks
    at a time, so the constant liar (on by default, for parallel workers) has nothing to do."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = TPESampler(n_startup_trials=job.n_startup_trials, seed=job.seed, constant_liar=False)
    study = optuna.create_study(directions=job.directions, sampler=sampler)
    study.add_trials(job.trials)
    return study.ask(job.space).params


class BackgroundTPE(BaseSampler):
    """TPE whose relative (multivariate) sampling runs in `runner`'s child; the start-up trials'
    random samples, and a sample whose child failed, are drawn here."""

    def __init__(self, runner: BackgroundRunner, seed: int | None, n_startup_trials: int) -> None:
        self.inner = TPESampler(seed=seed, n_startup_trials=n_startup_trials)
        self.runner, self.n_startup_trials = runner, n_startup_trials
        self._seeds = random.Random(seed)

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if not search_space or len(trials) < self.n_startup_trials:
            return self.inner.sample_relative(study, trial, search_space)     # {}: random start-up samples
        job = SampleJob(study.directions, trials, search_space, self.n_startup_trials, self._seeds.randrange(2**31))
        params = self.runner.run(sample, job, fallback=None)
        if params is None:
            return self.inner.sample_relative(study, trial, search_space)
        return {name: params[name] for name in search_space}

    def sample_independent(self, study: Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.inner.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.inner.before_trial(study, trial)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: list[float] | None) -> None:
        self.inner.after_trial(study, trial, state, values)
