"""The tuning report's data: what the tuner state in a state dir says, per regime and over time.

Read-only: the daemon serves the report while its controller keeps writing the same files, so
nothing here creates tables, studies or files. The state format is described in docs/tuning.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from autotuner.controller import ControllerSettings, chosen_configuration, paused_line
from autotuner.search_space import load_search_space

DB_NAME = "tuner.db"
DECISIONS_NAME = "decisions.jsonl"
STUDY_PREFIX = "regime:"
WINDOW_KEYS = ("ttft_p50_s", "tbt_p99_s", "goodput_rps", "slo_attainment", "arrival_rate_rps",
               "output_tokens_per_s", "input_output_ratio", "kv_usage_mean", "mfu", "mbu", "shed_rps",
               "num_running_mean", "draft_tokens_per_s", "draft_acceptance_rate", "draft_tokens_per_verify",
               "draft_tokens_per_decode")
KNOB_ORDER = ("token_budget", "prefill_priority", "max_num_seqs", "kv_admission_watermark", "policy")
# JSON reports rendered before the controller's windows were called tuning windows still parse.
OLD_KEYS = {"windows": "tuning_windows", "violated_windows": "violated_tuning_windows"}

Window = dict[str, "float | None"]


@dataclass(frozen=True)
class TrialRow:
    number: int
    source: str | None               # live, warm-start or recheck
    state: str                       # Optuna's TrialState name
    params: dict[str, Any]
    value: float | None              # the window's goodput_rps
    constraints: dict[str, float]    # feasible when all <= 0
    feasible: bool | None            # None: not complete, or no constraints recorded
    aborted: bool
    window: Window


@dataclass(frozen=True)
class TrialCounts:
    total: int                       # every trial, rejected ones included
    complete: int
    feasible: int
    failed: int                      # FAIL other than rejected
    aborted: int
    rejected: int
    running: int
    warm_start: int
    recheck: int


@dataclass(frozen=True)
class Outcome:
    """Goodput and SLO attainment over the tuning windows that ran one configuration."""
    knobs: dict[str, Any]
    tuning_windows: int
    goodput_rps: float | None
    slo_attainment: float | None


@dataclass(frozen=True)
class Chosen:
    trial: int
    params: dict[str, Any]
    value: float


@dataclass(frozen=True)
class RegimeReport:
    key: str
    regime: dict[str, Any]           # the study's "regime" user attr (buckets)
    created_at: str | None
    distributions: dict[str, str]    # Optuna's JSON per param, so plots can be redrawn from the report alone
    trials: tuple[TrialRow, ...]     # rejected trials never ran: counted, not listed
    counts: TrialCounts
    chosen: Chosen | None            # the controller's incumbent (controller.chosen_configuration)
    before: Outcome | None           # the regime's first tuning window
    after: Outcome | None            # the tuning windows that ran the chosen configuration
    tuning_windows: int              # tuning windows whose SLO verdict is known
    violated_tuning_windows: int
    status: str | None = None        # why exploration is paused (its latest measured window), else None


@dataclass(frozen=True)
class Decision:
    t: float
    time: str | None
    regime: str | None
    action: str
    trial: int | None
    knobs: dict[str, Any]
    context: dict[str, float | None]
    window: Window | None
    violated: bool | None
    held_attainment: float | None = None   # exploration paused: the incumbent's recent SLO attainment


@dataclass(frozen=True)
class Failure:
    """A part of the tuner that failed (its warm start, a TPE sample); serving went on."""
    t: float
    time: str | None
    stage: str
    cause: str


@dataclass(frozen=True)
class TuningReport:
    state_dir: str
    generated_at: str
    regimes: tuple[RegimeReport, ...]
    timeline: tuple[Decision, ...]
    tuning_windows: int
    violated_tuning_windows: int
    failures: tuple[Failure, ...] = ()   # none in logs written before failures were logged

    @property
    def violation_fraction(self) -> float | None:
        return self.violated_tuning_windows / self.tuning_windows if self.tuning_windows else None

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "violation_fraction": self.violation_fraction}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TuningReport":
        """The inverse of as_dict (the JSON rendering parsed back)."""
        d = _current_keys(d)
        regimes = tuple(_regime_from_dict(r) for r in d["regimes"])
        timeline = tuple(_decision_from_dict(e) for e in d["timeline"])
        failures = tuple(Failure(**f) for f in d.get("failures", ()))
        return cls(d["state_dir"], d["generated_at"], regimes, timeline, d["tuning_windows"],
                   d["violated_tuning_windows"], failures)


def _current_keys(d: dict[str, Any]) -> dict[str, Any]:
    return {OLD_KEYS.get(k, k): v for k, v in d.items()}


def _decision_from_dict(d: dict[str, Any]) -> Decision:
    """A rendered decision, its window on WINDOW_KEYS: a key an older report lacks reads None."""
    window = d.get("window")
    return Decision(**{**d, "window": None if window is None else _window(window)})


def _regime_from_dict(d: dict[str, Any]) -> RegimeReport:
    opt = lambda c, v: None if v is None else c(**_current_keys(v))   # noqa: E731
    d = _current_keys(d)
    trials = tuple(TrialRow(**{**t, "window": _window(t["window"])}) for t in d["trials"])
    return RegimeReport(**{**d, "trials": trials,
                           "counts": TrialCounts(**d["counts"]), "chosen": opt(Chosen, d["chosen"]),
                           "before": opt(Outcome, d["before"]), "after": opt(Outcome, d["after"])})


def build_report(state_dir: str) -> TuningReport:
    """Read DIR/tuner.db and DIR/decisions.jsonl; ValueError when neither holds anything."""
    db, log = os.path.join(state_dir, DB_NAME), os.path.join(state_dir, DECISIONS_NAME)
    # A zero-byte database is what a controller that died before its first study leaves.
    studies = _load_studies(db) if os.path.isfile(db) and os.path.getsize(db) else []
    entries = _load_entries(log) if os.path.isfile(log) else []
    timeline = tuple(_decision(e) for e in entries)
    if not studies and not timeline:
        raise ValueError(f"no tuner state in {state_dir}: run the daemon or `autotuned-serve tune --simulate` first")
    regimes = tuple(_regime(study, trials, timeline) for study, trials in studies)
    windows, violated = _verdicts(timeline)
    failures = tuple(_failure(e) for e in entries if e["action"] == "failure")
    return TuningReport(os.path.abspath(state_dir), datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        regimes, timeline, windows, violated, failures)


def _load_studies(db: str) -> list[tuple[Any, list[Any]]]:
    """(FrozenStudy, its FrozenTrials) for every regime study, in creation order."""
    import optuna
    import sqlalchemy.exc

    try:
        # skip_table_creation: never write to the controller's database, only read it.
        storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.abspath(db)}", skip_table_creation=True)
        try:
            studies = sorted(s for s in storage.get_all_studies() if s.study_name.startswith(STUDY_PREFIX))
            return [(s, storage.get_all_trials(storage.get_study_id_from_name(s.study_name))) for s in studies]
        finally:
            storage.remove_session()
            storage.engine.dispose()
    except (optuna.exceptions.OptunaError, sqlalchemy.exc.SQLAlchemyError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{db} is not a readable Optuna database: {reason}") from None


def _load_entries(path: str) -> list[dict[str, Any]]:
    """The decision log's entries, each one checked to read as a Decision (and a Failure where it is one)."""
    with open(path) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            _decision(entry)
            if entry["action"] == "failure":
                _failure(entry)
            entries.append(entry)
        except (ValueError, TypeError, KeyError, AttributeError):
            if n == len(lines):    # a crash mid-write leaves a torn last line; everything before it stands
                break
            raise ValueError(f"{path}:{n}: not a decision record") from None
    return entries


def _decision(d: dict[str, Any]) -> Decision:
    window = d.get("window")
    violated = d.get("violated")
    held = _num(d.get("held_attainment")) if d.get("exploration") == "paused" else None
    return Decision(float(d["t"]), d.get("time"), d.get("regime"), str(d["action"]), d.get("trial"),
                    dict(d.get("knobs") or {}), {k: _num(v) for k, v in (d.get("context") or {}).items()},
                    None if window is None else _window(window), None if violated is None else bool(violated),
                    held)


def _failure(d: dict[str, Any]) -> Failure:
    return Failure(float(d["t"]), d.get("time"), str(d["stage"]), str(d.get("cause") or ""))


def _regime(study: Any, trials: list[Any], timeline: tuple[Decision, ...]) -> RegimeReport:
    key = study.study_name.removeprefix(STUDY_PREFIX)
    rows = tuple(_trial_row(t) for t in trials if not t.user_attrs.get("rejected"))
    chosen = _chosen(trials)
    decisions = [d for d in timeline if d.regime == key]
    runs = _runs(decisions, rows)
    windows, violated = _verdicts(decisions)
    return RegimeReport(key, dict(study.user_attrs.get("regime") or {}), study.user_attrs.get("created_at"),
                        _distributions(trials), rows, _counts(trials, rows), chosen,
                        _outcome(runs[:1], runs[0][0]) if runs else None,
                        _after(runs, chosen), windows, violated, _status(decisions))


def _status(decisions: list[Decision]) -> str | None:
    """Why exploration is paused, as `tuner status` says it, when the latest measured window says it is."""
    measured = [d for d in decisions if d.window is not None]
    held = measured[-1].held_attainment if measured else None
    if held is None:
        return None
    return paused_line(held)


def _trial_row(trial: Any) -> TrialRow:
    state = trial.state.name
    constraints = {k: float(v) for k, v in trial.constraints.items()}
    feasible = all(v <= 0 for v in constraints.values()) if state == "COMPLETE" and constraints else None
    attrs = trial.user_attrs
    return TrialRow(trial.number, attrs.get("source"), state, ordered_knobs(trial.params), _num(trial.value),
                    constraints, feasible, bool(attrs.get("aborted", False)), _window(attrs.get("window") or {}))


def _chosen(trials: list[Any]) -> Chosen | None:
    """What the controller itself would run (`chosen_configuration`): the best mean over a
    configuration's windows (minus a noise margin) among those meeting the SLO on average, those
    serving (nearly) every request first; named by its first trial."""
    space = load_search_space()
    best = chosen_configuration(trials, space, ControllerSettings.load().nothing_to_win)
    if best is None:
        return None
    params, value = best
    first = min(t.number for t in trials if t.state.name == "COMPLETE" and space.snap(t.params) == params)
    return Chosen(first, ordered_knobs(params), value)


def _runs(decisions: list[Decision], rows: tuple[TrialRow, ...]) -> list[tuple[dict[str, Any], Window]]:
    """(knobs, window) per measured window in time order: the decision log's, else the trials' own.

    A decision carries the engine's Knobs, which have no policy; where it names its trial, that trial's
    params (the policy among them, when it is tuned) complete them."""
    if decisions:
        params = {r.number: r.params for r in rows}
        return [({**d.knobs, **params.get(d.trial, {})}, d.window) for d in decisions if d.window is not None]
    return [(r.params, r.window) for r in sorted(rows, key=lambda r: r.number)
            if any(v is not None for v in r.window.values())]


def _after(runs: list[tuple[dict[str, Any], Window]], chosen: Chosen | None) -> Outcome | None:
    if chosen is None:
        return None
    matching = [run for run in runs if _same_knobs(run[0], chosen.params)]
    return _outcome(matching, chosen.params) if matching else None


def _same_knobs(knobs: dict[str, Any], params: dict[str, Any]) -> bool:
    """Whether knobs ran the params: the decision log carries every knob, the trial only the tuned ones, and
    a param the log does not carry (a tuned policy in a window with no trial) cannot be told apart."""
    def same(a: Any, b: Any) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
        return a == b
    shared = [name for name in params if name in knobs]
    return bool(shared) and all(same(knobs[name], params[name]) for name in shared)


def _outcome(runs: list[tuple[dict[str, Any], Window]], knobs: dict[str, Any]) -> Outcome:
    return Outcome(ordered_knobs(knobs), len(runs), _mean(w["goodput_rps"] for _, w in runs),
                   _mean(w["slo_attainment"] for _, w in runs))


def _counts(trials: list[Any], rows: tuple[TrialRow, ...]) -> TrialCounts:
    states = [r.state for r in rows]
    sources = [r.source for r in rows]
    return TrialCounts(len(trials), states.count("COMPLETE"), sum(1 for r in rows if r.feasible),
                       states.count("FAIL"), sum(1 for r in rows if r.aborted), len(trials) - len(rows),
                       states.count("RUNNING"), sources.count("warm-start"), sources.count("recheck"))


def _distributions(trials: list[Any]) -> dict[str, str]:
    """One distribution per param, widened over the trials, so every trial fits it when plots rebuild them."""
    from optuna.distributions import distribution_to_json

    merged: dict[str, Any] = {}
    for trial in trials:
        for name, dist in trial.distributions.items():
            merged[name] = _widen(merged[name], dist) if name in merged else dist
    return {name: distribution_to_json(merged[name]) for name in ordered_knobs(merged)}


def _widen(a: Any, b: Any) -> Any:
    from optuna.distributions import CategoricalDistribution

    if isinstance(a, CategoricalDistribution) and isinstance(b, CategoricalDistribution):
        return CategoricalDistribution(list(dict.fromkeys([*a.choices, *b.choices])))
    if type(a) is type(b) and hasattr(a, "low"):
        return type(a)(min(a.low, b.low), max(a.high, b.high), log=a.log, step=a.step)
    return a


def _verdicts(decisions: list[Decision] | tuple[Decision, ...]) -> tuple[int, int]:
    """(tuning windows with a known SLO verdict, those that violated it)."""
    known = [d.violated for d in decisions if d.window is not None and d.violated is not None]
    return len(known), sum(known)


def _window(raw: dict[str, Any]) -> Window:
    return {k: _num(raw.get(k)) for k in WINDOW_KEYS}


def ordered_knobs(params: dict[str, Any]) -> dict[str, Any]:
    """Knobs in a fixed order (the tuned ones first), so tables and CSV columns line up."""
    rank = {name: i for i, name in enumerate(KNOB_ORDER)}
    return {k: params[k] for k in sorted(params, key=lambda k: (rank.get(k, len(rank)), k))}


def _num(v: Any) -> float | None:
    """A finite float, or None: JSON has no NaN, and a NaN metric means there was nothing to measure."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _mean(values: Any) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
