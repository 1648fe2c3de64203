"""The tuning report's speculation view: how long drafts the load let decodes verify, and how many of their
tokens were kept, read from the measured windows of the decision log (telemetry/window.py's draft fields).

The adaptive mode prices drafted rows per step (policies/draft_lengths.py): at low load decodes draft
long, at high load not at all. A window's `draft_tokens_per_verify` is the mean length of the drafts
verified (k of a decode that drafted), `draft_tokens_per_decode` the same over every decode (k = 0
included), so their gap is the share of decodes the load kept from drafting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving.report import Decision, TuningReport

LOAD_KEY = "num_running_mean"       # the load a window's draft lengths are set against: its decode batch


@dataclass(frozen=True)
class SpeculationRow:
    """One regime's windows that ran with speculation on; means are over those windows."""
    regime: str
    windows: int
    drafting: int                          # of them, windows that verified any drafted token
    running: float | None                  # mean running requests
    arrival_rate_rps: float | None
    per_decode: float | None               # drafted tokens per decode (k = 0 included)
    per_verify: float | None               # drafted tokens per decode that verified drafts, drafting windows
    acceptance: float | None               # kept / drafted, drafting windows
    knobs: tuple[str, ...]                 # the speculative_tokens / speculative_mode pairs that ran


@dataclass(frozen=True)
class SpeculationPoint:
    """One measured window with speculation on, for the plot of draft length against load."""
    running: float
    per_verify: float | None
    per_decode: float | None


def speculating(d: Decision) -> bool:
    """A measured window whose knobs drafted (or, in a log without them, whose steps did)."""
    if d.window is None:
        return False
    k = d.knobs.get("speculative_tokens")
    return (isinstance(k, (int, float)) and k > 0) or (d.window.get("draft_tokens_per_s") or 0.0) > 0


def speculation_rows(report: TuningReport) -> list[SpeculationRow]:
    """Per regime with speculating windows, lightest mean load first."""
    by_regime: dict[str, list[Decision]] = {}
    for d in report.timeline:
        if speculating(d):
            by_regime.setdefault(d.regime or "-", []).append(d)
    rows = [_row(regime, decisions) for regime, decisions in by_regime.items()]
    return sorted(rows, key=lambda r: (r.running is None, r.running or 0.0))


def speculation_points(report: TuningReport) -> list[SpeculationPoint]:
    return [SpeculationPoint(d.window[LOAD_KEY], d.window.get("draft_tokens_per_verify"),
                             d.window.get("draft_tokens_per_decode"))
            for d in report.timeline if speculating(d) and d.window.get(LOAD_KEY) is not None]


def _row(regime: str, decisions: list[Decision]) -> SpeculationRow:
    windows = [d.window for d in decisions]
    drafting = [w for w in windows if (w.get("draft_tokens_per_s") or 0.0) > 0]
    return SpeculationRow(regime, len(windows), len(drafting), _mean(w.get(LOAD_KEY) for w in windows),
                          _mean(w.get("arrival_rate_rps") for w in windows),
                          _mean(w.get("draft_tokens_per_decode") for w in windows),
                          _mean(w.get("draft_tokens_per_verify") for w in drafting),
                          _mean(w.get("draft_acceptance_rate") for w in drafting), _knobs_run(decisions))


def _knobs_run(decisions: list[Decision]) -> tuple[str, ...]:
    seen = {(k, str(d.knobs.get("speculative_mode") or "")) for d in decisions
            if isinstance(k := d.knobs.get("speculative_tokens"), (int, float))}
    return tuple(f"{k:g} {mode}".strip() for k, mode in sorted(seen))


def _mean(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
