"""The online tuner: regimes, search space, objective, the Optuna controller and its service in the
daemon, the simulator-backed warm start, and `tune --simulate`'s what-if run."""
