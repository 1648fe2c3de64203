"""What a measured window is worth to the tuner.

Value: goodput (requests/s that met every SLO, DistServe's definition) as a share of the requests
offered in the same window, so that windows of one regime compare fairly although their arrival
counts differ; a small queueing term breaks ties between configurations that all keep up (the one
whose requests wait least for their first token has the most capacity to spare for a burst).
Constraints (Optuna's `set_constraint`, feasible when <= 0): P50 TTFT and P99 TBT against their
SLOs, Sarathi-Serve's capacity criterion.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.slo_class import SloClass
from telemetry.window import WindowSummary

HEADROOM_WEIGHT = 0.01


@dataclass(frozen=True)
class Score:
    value: float
    constraints: dict[str, float]       # name -> amount over the SLO (s); <= 0 is met

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())


def score(goodput_rps: float, offered_rps: float, ttft_p50_s: float | None, tbt_p99_s: float | None,
          slo: SloClass) -> Score:
    """A window with no first token or no gap yet counts as missing that SLO by its whole bound."""
    ttft = ttft_p50_s if ttft_p50_s is not None else 2 * slo.ttft_s
    tbt = tbt_p99_s if tbt_p99_s is not None else 2 * slo.tbt_s
    share = min(1.0, goodput_rps / offered_rps) if offered_rps > 0 else 0.0
    # P50 TTFT is mostly queueing: its room is spare capacity. Room under the TBT bound is not: it
    # comes from smaller steps, which leave less capacity, and scoring it led the tuner to small
    # token caps that broke at the first burst (`tune --simulate --workload shift-gpu`).
    headroom = 1.0 - min(ttft / slo.ttft_s, 2.0)
    return Score(share + HEADROOM_WEIGHT * headroom, {"ttft_p50": ttft - slo.ttft_s, "tbt_p99": tbt - slo.tbt_s})


def score_window(window: WindowSummary, slo: SloClass, weights: dict[str, float], default_class: str) -> Score:
    """`score` of a telemetry window. With several SLO classes in it, the share is each class's
    attainment weighted by `weights` (per request) times the share of arrivals that finished, and the
    constraints are the default class's own latencies (its SLO is `slo`); pooled percentiles would
    judge interactive TBT by batch requests' 2-s gaps."""
    if len(window.finished_by_class) <= 1:
        return score(window.goodput_rps, window.arrival_rate_rps, window.ttft_p50_s, window.tbt_p99_s, slo)
    weight = {c: weights.get(c, 1.0) * n for c, n in window.finished_by_class.items()}
    attainment = sum(weight[c] * window.slo_attainment_by_class[c] for c in weight) / (sum(weight.values()) or 1.0)
    finished_share = window.num_finished / window.num_arrivals if window.num_arrivals else 1.0
    offered = window.arrival_rate_rps
    return score(attainment * finished_share * offered, offered, window.ttft_p50_by_class.get(default_class),
                 window.tbt_p99_by_class.get(default_class), slo)


def slo_excess(constraints: dict[str, float]) -> float:
    """How far a measured (or simulated) configuration missed the SLO: its positive constraint
    values (excess over each bound, as told to Optuna), summed; 0 when it met every bound."""
    return sum(max(0.0, v) for v in constraints.values())


def badly_violated(result: Score, slo: SloClass, factor: float) -> bool:
    """For aborting a trial early: a partial window already `factor` times over an SLO (a missing
    latency, scored at twice its bound, is not evidence enough)."""
    return (result.constraints["ttft_p50"] > (factor - 1) * slo.ttft_s
            or result.constraints["tbt_p99"] > (factor - 1) * slo.tbt_s)
