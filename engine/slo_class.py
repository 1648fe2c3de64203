"""Per-request SLO classes: the latency targets a request is scheduled against and judged by.

A request names its class (`slo_class` in the body or the `X-SLO-Class` header); the deadline
policy sizes steps from each running request's class targets, and goodput is counted per class.
Classes come from configs/slo_classes.yaml; `default` names the class of requests that name none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import yaml

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "slo_classes.yaml"
# Half the tightest TTFT: on the shipped classes a step of at most 1 s, which leaves an interactive
# arrival that waits one out ~1 s for its own prefill (a 200-token chat prompt takes ~0.5 s on the
# 2-core CPU at slack-sized steps). Without it a batch prompt's 2048-token step (~3 s there) made
# every interactive arrival during it miss 2 s (simulated mixed-classes: 18 TTFT misses of 159
# interactive requests at load 0.5, against 4 on chat alone).
ARRIVAL_GUARD_FRACTION = 0.5
LATE_RULES = ("shed", "serve")


@dataclass(frozen=True)
class SloClass:
    """The one type of latency targets: a request's class, and the targets a run or reader judges
    records that carry none by (`telemetry.window.meets_slo`); the defaults are written only here."""

    name: str = "interactive"
    ttft_s: float = 2.0            # arrival -> first token
    tbt_s: float = 0.25            # gap between consecutive tokens, at `tbt_percentile` of the request's gaps
    tbt_percentile: float = 99.0
    weight: float = 1.0            # this class's share in the tuner's objective, per request
    # a queued request past its TTFT deadline before its prefill began, while admission is on
    # (engine/scheduling/admission.py): "shed" ends it with 429 (it has missed; its work would take capacity
    # from requests that can still make theirs), "serve" serves it late
    late: str = "shed"

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.tbt_s > 0 and 0 < self.tbt_percentile <= 100 and self.weight >= 0):
            raise ValueError(f"SLO class {self.name!r}: ttft_s and tbt_s must be > 0, tbt_percentile in "
                             f"(0, 100], weight >= 0")
        if self.late not in LATE_RULES:
            raise ValueError(f"SLO class {self.name!r}: late must be one of {', '.join(LATE_RULES)}")


DEFAULT_CLASS = SloClass()


@dataclass(frozen=True)
class SloClasses:
    classes: dict[str, SloClass]
    default: str

    def __post_init__(self) -> None:
        if self.default not in self.classes:
            raise ValueError(f"default SLO class {self.default!r} is not one of {', '.join(self.classes)}")

    def get(self, name: str | None) -> SloClass:
        """The named class (the default one for None); ValueError names the known ones."""
        if name is None:
            return self.classes[self.default]
        if name not in self.classes:
            raise ValueError(f"unknown slo_class {name!r}; known: {', '.join(self.classes)}")
        return self.classes[name]

    def arrival_guard_s(self) -> float:
        """The longest step the deadline policy lets run while prompts of the tightest class may
        arrive: ARRIVAL_GUARD_FRACTION of that class's TTFT target, so an arrival that waits out a
        whole step still has the rest for its own prefill."""
        return ARRIVAL_GUARD_FRACTION * min(c.ttft_s for c in self.classes.values())

    def with_default_targets(self, ttft_s: float, tbt_s: float) -> SloClasses:
        """The default class re-targeted (the daemon's `slo` setting names the default class's targets)."""
        base = self.classes[self.default]
        changed = replace(base, ttft_s=ttft_s, tbt_s=tbt_s)
        return SloClasses(self.classes | {self.default: changed}, self.default)

    @staticmethod
    def load(path: str | Path = CONFIG) -> SloClasses:
        try:
            data = yaml.safe_load(Path(path).read_text())
            classes = {name: SloClass(name, **spec) for name, spec in data["classes"].items()}
            return SloClasses(classes, data.get("default", next(iter(classes))))
        except (OSError, KeyError, TypeError, AttributeError, ValueError, StopIteration, yaml.YAMLError) as e:
            raise ValueError(f"cannot read SLO classes {path}: {e}") from e

    @staticmethod
    def single(cls: SloClass = DEFAULT_CLASS) -> SloClasses:
        return SloClasses({cls.name: cls}, cls.name)


@cache
def shipped_slo_classes() -> SloClasses:
    """configs/slo_classes.yaml, read once."""
    return SloClasses.load()
