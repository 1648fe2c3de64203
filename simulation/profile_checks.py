"""A profile's checks: its step-time model's predictions next to the published figures it carries.

Each check predicts one measure (the linear layers of a step as Vidur profiles them, a decode or a
prefill step, one all-reduce), or the ratio of two, and passes within TOLERANCE of the figure.
Calibration checks show the profile reproduces what it was tuned on; held-out checks are the test.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.step_shape import attended_pairs, context_tokens
from simulation.hardware_profile import Check, HardwareProfile, Measure
from simulation.profile_cost_model import ProfileCostModel

TOLERANCE = 0.15


@dataclass(frozen=True)
class CheckResult:
    check: Check
    predicted: float            # ms, or a ratio

    @property
    def error(self) -> float:
        """Relative: (predicted - expected) / expected."""
        return self.predicted / self.check.expected - 1.0

    @property
    def ok(self) -> bool:
        return abs(self.error) <= TOLERANCE

    def line(self) -> str:
        c = self.check
        unit = "x" if c.over is not None else " ms"
        return (f"{'ok  ' if self.ok else 'FAIL'} {c.name:<34} {c.role:<11} predicted {self.predicted:8.3f}{unit}"
                f"  published {c.expected:8.3f}{unit}  {100 * self.error:+5.1f}%  ({c.source})")


def measure_ms(model: ProfileCostModel, m: Measure) -> float:
    """The measure's predicted time in ms, at the measure's TP degree if it names one."""
    if m.tp and m.tp != model.tp:
        model = model.at_tp(m.tp)
    t = model.terms
    if m.kind == "linear":
        seconds = t.linear_s(m.tokens)
    elif m.kind == "decode":
        b, c = m.batch, m.context
        seconds = model.predict_counts(0, b, b, b * context_tokens(1, c), b * attended_pairs(1, c), b)
    elif m.kind == "prefill":
        n, c = m.tokens, m.context
        seconds = model.predict_counts(n, 0, 1, context_tokens(n, c), attended_pairs(n, c), 1)
    elif m.kind == "allreduce":
        ar = model.profile.hardware.allreduce_for(model.tp)
        seconds = ar.latency_us * 1e-6 + m.bytes / (ar.bandwidth_gbs * 1e9)
    else:
        raise ValueError(f"unknown measure kind {m.kind!r}")
    return 1e3 * seconds


def run_check(model: ProfileCostModel, check: Check) -> CheckResult:
    value = measure_ms(model, check.measure)
    if check.over is not None:
        value /= measure_ms(model, check.over)
    return CheckResult(check, value)


def run_checks(profile: HardwareProfile) -> list[CheckResult]:
    model = ProfileCostModel(profile)
    return [run_check(model, c) for c in profile.checks]
