"""The next intervals' arrival rate from the past ones (pure; the planner's forecaster).

`last` repeats the newest rate; `ewma` smooths noise away (and lags a ramp); `holt` is Holt's
linear (double exponential) smoothing, level plus trend, extrapolated over the horizon the plan
must cover (a replica asked for now serves only after its start-up), so it runs ahead of a
diurnal ramp. Dynamo's planner offers constant, ARIMA and Prophet predictors for the same job."""

from __future__ import annotations

from collections.abc import Sequence


def forecast(rates: Sequence[float], method: str, alpha: float = 0.5, beta: float = 0.3,
             horizon: float = 1.0) -> float:
    """The rate `horizon` intervals after the newest of `rates` (oldest first); never negative."""
    rates = list(rates)
    if not rates:
        return 0.0
    if method == "last":
        return max(0.0, rates[-1])
    if method == "ewma":
        return max(0.0, ewma(rates, alpha))
    if method == "holt":
        level, trend = holt(rates, alpha, beta)
        return max(0.0, level + horizon * trend)
    raise ValueError(f"unknown forecaster {method!r}")


def ewma(rates: Sequence[float], alpha: float) -> float:
    level = rates[0]
    for rate in rates[1:]:
        level = alpha * rate + (1 - alpha) * level
    return level


def holt(rates: Sequence[float], alpha: float, beta: float) -> tuple[float, float]:
    """(level, trend per interval) after the last rate; the trend starts at 0."""
    level, trend = rates[0], 0.0
    for rate in rates[1:]:
        previous = level
        level = alpha * rate + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
    return level, trend
