"""The online controller (search space, objective, Optuna loop) and the command line that composes everything."""
