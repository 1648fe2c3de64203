"""The online controller's settings: each one's default and meaning, defined here only.

configs/tuning.yaml's `controller:` section (absent by default) overrides them; docs/configuration.md
lists them (rendered from this dataclass).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from autotuner.search_space import CONFIG
from policies import DEFAULT_POLICY
from telemetry.window import HORIZON_S as TELEMETRY_HORIZON_S


def setting(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ControllerSettings:
    policy: str = setting(DEFAULT_POLICY, "the policy whose knobs are tuned: deadline sizes each step from the TBT "
                          "slack (the inner loop); adaptive is the plain token budget (ablation)")
    min_window_s: float = setting(10.0, "shortest measurement window")
    context_window_s: float = setting(60.0, "the workload context (regime, drift) is read over this long; the "
                                      "engine's error budget spends over the same horizon")
    max_window_s: float = setting(120.0, "longest window; one ends earlier once it holds enough requests and gaps")
    min_requests: int = setting(40, "finished requests a window needs to count (20 left GPU-rate windows at "
                                "~12 s, too noisy)")
    min_window_requests: int = setting(20, "where max_window_s holds fewer arrivals, a window (and the context) "
                                       "grows to hold this many ...")
    longest_window_s: float = setting(600.0, "... up to this long (at most the telemetry's horizon); below "
                                      "min_requests a window only checks the SLO: configurations are ranked by "
                                      "the warm start's cost model, not live")
    min_tbt_samples: int = setting(1000, "token gaps a window needs for a stable P99 TBT (~10 gaps above P99)")
    settle_fraction: float = setting(0.25, "after a change, this share of the window passes before measuring")
    trust_radius: float = setting(0.15, "exploration stays within this share of each knob's range of the incumbent")
    explore_trials: int = setting(8, "trials per regime before exploration slows down")
    explore_every: int = setting(4, "after that, one window in this many explores; the rest re-measure the "
                                 "incumbent")
    recheck_every: int = setting(6, "re-measure the incumbent every this many trials (noise)")
    abort_factor: float = setting(2.0, "a trial whose partial window exceeds the SLO this many times over is "
                                  "rolled back")
    nothing_to_win: float = setting(0.98, "an incumbent whose latest windows serve this share of their requests "
                                    "within the SLO is re-measured, not explored away from (>1: always explore)")
    warm_start_trials: int = setting(30, "simulator trials searched before exploring a new regime live")
    warm_start_enqueue: int = setting(3, "best simulated configurations tried first")
    warm_start_timeout_s: float = setting(600.0, "a warm start still searching after this long is dropped (live "
                                          "exploration goes on)")
    background: bool = setting(True, "run the warm start and TPE's samples in a separate process at the lowest "
                               "priority on one core (false: in the serving process; for comparisons only)")
    background_cpu_share: float = setting(0.5, "... the warm start using at most this share of that core (it "
                                          "sleeps between trials)")

    @staticmethod
    def load(path: str | Path = CONFIG, **overrides: Any) -> ControllerSettings:
        """The defaults, overridden by the file's `controller:` section and then by `overrides`."""
        data = (yaml.safe_load(Path(path).read_text()) or {}).get("controller", {}) | overrides
        unknown = set(data) - {f.name for f in fields(ControllerSettings)}
        if unknown:
            raise ValueError(f"{path}: unknown controller settings {sorted(unknown)}")
        return ControllerSettings(**data)

    def __post_init__(self) -> None:
        if self.min_window_requests < 1:
            raise ValueError(f"controller: min_window_requests must be at least 1, not {self.min_window_requests}")
        if not self.max_window_s <= self.longest_window_s <= TELEMETRY_HORIZON_S:
            raise ValueError(f"controller: longest_window_s ({self.longest_window_s}) must lie between max_window_s "
                             f"({self.max_window_s}) and the telemetry's horizon ({TELEMETRY_HORIZON_S} s)")

    @property
    def window_requests(self) -> int:
        """Requests a window and the workload context must hold where time allows."""
        return min(self.min_window_requests, self.min_requests)
