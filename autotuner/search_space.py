"""The tuner's search space (from configs/tuning.yaml): Optuna distributions over knobs, and the
trust region around the incumbent that live exploration stays inside."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

from policies import POLICIES
from policies.knobs import DAEMON_KNOBS, KNOB_SPECS, Knobs

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tuning.yaml"
SHIPPED_KNOBS = Knobs(**DAEMON_KNOBS)      # what the daemon serves untold, and the tuner falls back to
DEFAULT_KNOBS = SHIPPED_KNOBS.as_dict()


@dataclass(frozen=True)
class KnobRange:
    name: str
    low: float
    high: float
    log: bool = False
    step: int | None = None        # token_budget moves in multiples of a tile
    off_below: float | None = None # values below this mean 0, the knob's "off" (ttft_pace under 1 plans lateness)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if KNOB_SPECS[self.name].kind is int:
            return optuna.distributions.IntDistribution(int(self.low), int(self.high), log=self.log)
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log)

    def snap(self, value: float) -> float:
        """Onto the tile grid, inside the range."""
        if self.step:
            value = max(self.step, round(value / self.step) * self.step)
        if self.off_below is not None and value < self.off_below:
            value = 0
        value = min(self.high, max(self.low, value))
        return round(value) if KNOB_SPECS[self.name].kind is int else float(value)

    def distance(self, a: float, b: float) -> float:
        """How far apart two values are, as a share of the range (in log space for log knobs)."""
        if self.log:
            return abs(math.log(a) - math.log(b)) / (math.log(self.high) - math.log(self.low))
        return abs(a - b) / (self.high - self.low)


@dataclass(frozen=True)
class SearchSpace:
    ranges: tuple[KnobRange, ...]
    policies: tuple[str, ...] = ()          # when set, the policy is tuned too

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        dists = {r.name: r.distribution() for r in self.ranges}
        if self.policies:
            dists["policy"] = optuna.distributions.CategoricalDistribution(self.policies)
        return dists

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Define-by-run sampling of the whole space (snapped onto the tile grid)."""
        params: dict[str, Any] = {}
        for r in self.ranges:
            if KNOB_SPECS[r.name].kind is int:
                params[r.name] = trial.suggest_int(r.name, int(r.low), int(r.high), log=r.log)
            else:
                params[r.name] = trial.suggest_float(r.name, r.low, r.high, log=r.log)
        if self.policies:
            params["policy"] = trial.suggest_categorical("policy", self.policies)
        return self.snap(params)

    def snap(self, params: dict[str, Any]) -> dict[str, Any]:
        """Every knob of the space on its grid; a knob `params` lacks takes its default (a study
        stored before the knob joined the space carries over)."""
        snapped = {r.name: r.snap(params.get(r.name, DEFAULT_KNOBS[r.name])) for r in self.ranges}
        if "policy" in params:
            snapped["policy"] = params["policy"]
        return snapped

    def within(self, params: dict[str, Any], center: dict[str, Any], radius: float) -> bool:
        """Every knob within `radius` (share of its range) of the center; the policy only if equal."""
        params, center = self.snap(params), self.snap(center)
        if self.policies and params.get("policy") != center.get("policy", params.get("policy")):
            return False
        return all(r.distance(params[r.name], center[r.name]) <= radius
                   or (r.step is not None and abs(params[r.name] - center[r.name]) <= r.step)   # one tile always
                   for r in self.ranges)

    def project(self, params: dict[str, Any], center: dict[str, Any], radius: float) -> dict[str, Any]:
        """The point of the trust region nearest to `params` (knob by knob)."""
        params, center = self.snap(params), self.snap(center)
        out = dict(params)
        for r in self.ranges:
            lo, hi = _interval(r, center[r.name], radius)
            if r.step:                         # a move of one tile is always allowed, or small budgets freeze
                lo, hi = min(lo, center[r.name] - r.step), max(hi, center[r.name] + r.step)
            value = r.snap(min(hi, max(lo, params[r.name])))
            if value > hi:                     # the tile grid, or rounding to an integer, went past the edge
                value = r.snap(value - r.step) if r.step else r.snap(math.floor(hi))
            elif value < lo:
                value = r.snap(value + r.step) if r.step else r.snap(math.ceil(lo))
            out[r.name] = value
        if self.policies and "policy" in center:
            out["policy"] = center["policy"]
        return out

    def clamp(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """A knob dict (e.g. the engine's current knobs) moved into the space."""
        return {r.name: r.snap(knobs[r.name]) for r in self.ranges} | (
            {"policy": knobs["policy"]} if self.policies and knobs.get("policy") in self.policies else {})


def _interval(r: KnobRange, center: float, radius: float) -> tuple[float, float]:
    if r.log:
        span = radius * (math.log(r.high) - math.log(r.low))
        return center * math.exp(-span), center * math.exp(span)
    span = radius * (r.high - r.low)
    return center - span, center + span


def load_search_space(path: str | Path = CONFIG, max_token_budget: int | None = None) -> SearchSpace:
    """The `search_space` section; the budget's top is capped at what the engine was sized for."""
    data = yaml.safe_load(Path(path).read_text())["search_space"]
    ranges = []
    for name, spec in data.get("knobs", {}).items():
        if name not in KNOB_SPECS or KNOB_SPECS[name].kind is str:
            raise ValueError(f"{path}: search_space knob {name!r} is not a numeric knob")
        high = spec["high"]
        if name == "token_budget" and max_token_budget:
            high = min(high, max_token_budget)
        knob = KnobRange(name, spec["low"], high, bool(spec.get("log", False)), spec.get("step"), spec.get("off_below"))
        for bound in (knob.low, knob.high):
            KNOB_SPECS[name].check(name, bound)
        ranges.append(knob)
    policies = tuple(data.get("policies") or ())
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"{path}: unknown policies {unknown}; known: {', '.join(POLICIES)}")
    return SearchSpace(tuple(ranges), policies)
