"""The tuning report as JSON, CSV (one row per trial) or one standalone HTML file.

The HTML has no external references at all (styles in the page, plots as base64 PNG data URIs),
so it can be mailed, attached to a ticket or opened on a machine with no network.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from serving.report import (WINDOW_KEYS, Decision, Failure, Outcome, RegimeReport, TrialRow, TuningReport,
                            ordered_knobs)
from serving.report_speculation import SpeculationPoint, SpeculationRow, speculation_points, speculation_rows

MIN_TRIALS_FOR_IMPORTANCE = 4
# Optuna's matplotlib plots draw through pyplot, whose figure registry and style are process-global
# and not thread-safe; the daemon renders reports from worker threads.
_PYPLOT_LOCK = threading.Lock()


@dataclass(frozen=True)
class Plot:
    title: str
    uri: str | None      # data:image/png;base64,... or None when skipped
    note: str = ""       # why it was skipped


def render_json(report: TuningReport) -> str:
    return json.dumps(report.as_dict(), indent=2, allow_nan=False) + "\n"


def render_csv(report: TuningReport) -> str:
    params = list(ordered_knobs({p: None for r in report.regimes for t in r.trials for p in t.params}))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["regime", "number", "source", "state", *params, "value", "feasible", *WINDOW_KEYS])
    for regime in report.regimes:
        for t in regime.trials:
            cells = [regime.key, t.number, t.source, t.state, *(t.params.get(p) for p in params), t.value,
                     t.feasible, *(t.window[k] for k in WINDOW_KEYS)]
            writer.writerow([_csv_cell(c) for c in cells])
    return out.getvalue()


def _csv_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


# --- HTML -------------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; } td.text, th.text { text-align: left; }
tr.chosen td { background: #e3f4e3; font-weight: bold; } tr.infeasible td { background: #fbe9e9; }
tr.failed td { color: #888; } .note { color: #666; font-style: italic; }
img { max-width: 100%; display: block; margin: 0.5em 0; } code { background: #f4f4f4; padding: 0 0.2em; }
"""


def render_html(report: TuningReport) -> str:
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<title>Tuning report: {_esc(report.state_dir)}</title><style>{STYLE}</style></head><body>",
             "<h1>Tuning report</h1>", _overview(report), *_failures_section(report.failures),
             "<h2>Summary</h2>", _summary_table(report),
             "<h2>Admission</h2>", _admission_table(report),
             "<h2>Speculation</h2>", *_speculation_section(report),
             "<h2>Timeline</h2>", _plot_html(Plot("Knobs against the workload (red: SLO violated, dotted: regime "
                                                   "change)", _timeline_png(report.timeline),
                                                   "no controller decisions recorded")),
             *(_regime_section(r) for r in report.regimes), "</body></html>\n"]
    return "\n".join(parts)


RENDERERS: dict[str, Callable[[TuningReport], str]] = {"html": render_html, "json": render_json, "csv": render_csv}


def _overview(report: TuningReport) -> str:
    fraction = report.violation_fraction
    violated = "no tuning windows with an SLO verdict" if fraction is None else (
        f"{report.violated_tuning_windows} of {report.tuning_windows} tuning windows ({fraction:.1%}) "
        "violated the SLO")
    return (f"<p>State <code>{_esc(report.state_dir)}</code>, generated {_esc(report.generated_at)}: "
            f"{len(report.regimes)} regime(s), {len(report.timeline)} controller decision(s); {_esc(violated)}.</p>")


def _failures_section(failures: tuple[Failure, ...]) -> list[str]:
    """The tuner's own failures (serving went on without them): a section only when there are any."""
    if not failures:
        return []
    rows = [([_esc(f.time or f"t={f.t:g} s"), _esc(f.stage), _esc(f.cause)], "") for f in failures]
    return ["<h2>Tuner failures</h2>", _table(["time", "stage", "cause"], rows, text_columns={0, 1, 2})]


def _summary_table(report: TuningReport) -> str:
    headers = ["regime", "chosen trial", "chosen knobs", "goodput rps before → after",
               "SLO attainment before → after", "trials: complete / feasible / aborted / failed / rejected / running",
               "tuning windows violating the SLO"]
    rows = []
    for r in report.regimes:
        c = r.counts
        rows.append(([_link(r.key), _cell(r.chosen.trial if r.chosen else None),
                      _esc(_knobs_text(r.chosen.params) if r.chosen else "none feasible yet"),
                      _esc(_change(r.before, r.after, "goodput_rps")),
                      _esc(_change(r.before, r.after, "slo_attainment")),
                      _esc(f"{c.complete} / {c.feasible} / {c.aborted} / {c.failed} / {c.rejected} / {c.running}"),
                      _esc(f"{r.violated_tuning_windows} of {r.tuning_windows}")], ""))
    return _table(headers, rows, text_columns={0, 2}) if rows else '<p class="note">No regime studies yet.</p>'


def _admission_table(report: TuningReport) -> str:
    """What overload shed in the measured windows, per regime: shed requests count as missed in the tuner's
    objective, so a configuration cannot raise its attainment by refusing work."""
    by_regime: dict[str, list[Decision]] = {}
    for d in report.timeline:
        if d.window is not None and d.window.get("arrival_rate_rps") is not None:
            by_regime.setdefault(d.regime or "-", []).append(d)
    rows = []
    for regime, decisions in by_regime.items():
        shed = [d.window.get("shed_rps") or 0.0 for d in decisions]
        arrivals = sum(d.window["arrival_rate_rps"] for d in decisions)
        slacks = sorted({d.knobs.get("admission_slack") for d in decisions if d.knobs.get("admission_slack") is not None})
        rows.append(([_esc(regime), _cell(len(decisions)), _cell(sum(s > 0 for s in shed)),
                      _esc(f"{sum(shed) / arrivals:.1%}" if arrivals else "-"), _cell(max(shed)),
                      _esc(", ".join(f"{v:g}" for v in slacks) or "-")], ""))
    if not rows:
        return '<p class="note">No measured windows yet.</p>'
    return _table(["regime", "windows", "windows that shed", "share of arrivals shed", "most shed rps in a window",
                   "admission_slack run"], rows, text_columns={0, 5})


def _speculation_section(report: TuningReport) -> list[str]:
    """The table, and the plot of draft length against load where the windows carry their running requests."""
    rows = speculation_rows(report)
    if not rows:
        return ['<p class="note">No measured window ran speculative decoding (speculative_tokens 0).</p>']
    points = speculation_points(report)
    plot = Plot("Drafted tokens per decode against load (one point per window)", _draft_length_png(points),
                "the windows do not record their running requests")
    return [_speculation_table(rows), _plot_html(plot)]


def _speculation_table(rows: list[SpeculationRow]) -> str:
    """Per regime, lightest load first: how long the drafts the load let decodes verify were, and how many
    of their tokens the target kept (serving/report_speculation.py)."""
    return _table(["regime", "windows with speculation on", "windows that drafted", "running requests", "arrival rps",
                   "drafted tokens per decode", "drafted tokens per verifying decode (k)", "acceptance rate",
                   "speculative_tokens run"], [(_speculation_cells(r), "") for r in rows], text_columns={0, 8})


def _speculation_cells(r: SpeculationRow) -> list[str]:
    acceptance = "-" if r.acceptance is None else f"{r.acceptance:.1%}"
    return [_esc(r.regime), _cell(r.windows), _cell(r.drafting), _cell(r.running), _cell(r.arrival_rate_rps),
            _cell(r.per_decode), _cell(r.per_verify), _esc(acceptance), _esc(", ".join(r.knobs) or "-")]


def _regime_section(r: RegimeReport) -> str:
    buckets = ", ".join(f"{k}={v}" for k, v in r.regime.items()) or "no bucket attributes"
    c = r.counts
    lines = [f'<h2 id="{_esc(_anchor(r.key))}">Regime <code>{_esc(r.key)}</code></h2>',
             f"<p>{_esc(buckets)}; created {_esc(r.created_at or 'unknown')}. {c.total} trials: "
             f"{c.complete} complete ({c.feasible} feasible), {c.aborted} aborted, {c.failed} failed, "
             f"{c.rejected} rejected outside the trust region, {c.running} left running, "
             f"{c.warm_start} warm-start, {c.recheck} recheck.</p>"]
    if r.status:
        lines.append(f"<p>Tuner: {_esc(r.status)}.</p>")
    if r.chosen:
        lines.append(f"<p>Chosen configuration: trial {r.chosen.trial}, <code>{_esc(_knobs_text(r.chosen.params))}"
                     f"</code>, goodput {_cell(r.chosen.value)} rps.</p>")
    else:
        lines.append('<p class="note">No feasible trial yet: nothing chosen.</p>')
    lines.append(f"<p>{_esc(_outcome_text('Before', r.before))}<br>{_esc(_outcome_text('After', r.after))}</p>")
    lines += [_plot_html(p) for p in _optuna_plots(r)]
    lines += ["<h3>Trials</h3>", _trials_table(r)]
    return "\n".join(lines)


def _trials_table(r: RegimeReport) -> str:
    params = list(r.distributions) or list(ordered_knobs({p: None for t in r.trials for p in t.params}))
    headers = ["#", "source", "state", *params, "value", "feasible", "aborted", *WINDOW_KEYS]
    rows = [([_cell(t.number), _esc(t.source or ""), _esc(t.state), *(_cell(t.params.get(p)) for p in params),
              _cell(t.value), _cell(t.feasible), _cell(t.aborted), *(_cell(t.window[k]) for k in WINDOW_KEYS)],
             _row_class(t, r)) for t in r.trials]
    return _table(headers, rows, text_columns={1, 2}) if rows else '<p class="note">No trials.</p>'


def _row_class(t: TrialRow, r: RegimeReport) -> str:
    if r.chosen and t.number == r.chosen.trial:
        return "chosen"
    return "infeasible" if t.feasible is False else "failed" if t.state != "COMPLETE" else ""


def _table(headers: list[str], rows: list[tuple[list[str], str]], text_columns: set[int]) -> str:
    """Cells are already escaped HTML; headers are plain text."""
    cls = lambda i: ' class="text"' if i in text_columns else ""   # noqa: E731
    head = "".join(f"<th{cls(i)}>{_esc(h)}</th>" for i, h in enumerate(headers))
    tr = lambda row_class: f'<tr class="{row_class}">' if row_class else "<tr>"   # noqa: E731
    body = "".join(tr(row_class) + "".join(f"<td{cls(i)}>{c}</td>" for i, c in enumerate(cells)) + "</tr>"
                   for cells, row_class in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _plot_html(plot: Plot) -> str:
    if plot.uri is None:
        return f'<h3>{_esc(plot.title)}</h3><p class="note">{_esc(plot.note)}</p>'
    return f'<h3>{_esc(plot.title)}</h3><img alt="{_esc(plot.title)}" src="{plot.uri}">'


# --- text helpers ------------------------------------------------------------------------------------

def _esc(text: str) -> str:
    return html.escape(str(text))


def _fmt(v: Any) -> str:
    """Plain text of a value; escape it before it goes into the page."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell(v: Any) -> str:
    return _esc(_fmt(v))


def _knobs_text(knobs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in knobs.items())


def _change(before: Outcome | None, after: Outcome | None, metric: str) -> str:
    a, b = (getattr(o, metric) if o else None for o in (before, after))
    text = f"{_fmt(a)} → {_fmt(b)}"
    if a and b is not None:
        text += f" ({(b - a) / a:+.0%})"
    return text


def _outcome_text(label: str, o: Outcome | None) -> str:
    if o is None:
        return f"{label}: no measured tuning window."
    return (f"{label}: goodput {_fmt(o.goodput_rps)} rps, SLO attainment {_fmt(o.slo_attainment)} "
            f"over {o.tuning_windows} tuning window(s) of {_knobs_text(o.knobs)}.")


def _anchor(key: str) -> str:
    return "regime-" + "".join(ch if ch.isalnum() else "-" for ch in key)


def _link(key: str) -> str:
    return f'<a href="#{_esc(_anchor(key))}">{_esc(key)}</a>'


# --- plots -------------------------------------------------------------------------------------------

def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _timeline_png(timeline: tuple[Decision, ...]) -> str | None:
    """Knobs against the workload context over time, SLO violations and regime changes marked."""
    if not timeline:
        return None
    t = [d.t for d in timeline]
    fig = Figure(figsize=(10, 7), layout="constrained")
    budget_ax, priority_ax, context_ax = fig.subplots(3, 1, sharex=True)
    budget = _series(timeline, lambda d: d.knobs.get("token_budget"))
    budget_ax.step(t, budget, where="post", color="C0", label="token_budget")
    if any(v > 0 for v in budget if not math.isnan(v)):
        budget_ax.set_yscale("log", base=2)
    priority_ax.step(t, _series(timeline, lambda d: d.knobs.get("prefill_priority")), where="post", color="C1",
                     label="prefill_priority")
    priority_ax.set_ylim(-0.05, 1.05)
    # Steps, like the knobs: each decision's context describes the window that led to it, not a trend.
    context_ax.step(t, _series(timeline, lambda d: d.context.get("arrival_rate_rps")), where="post", color="C2",
                    label="arrival rate (req/s)")
    ratio_ax = context_ax.twinx()
    ratio_ax.step(t, _series(timeline, lambda d: d.context.get("io_ratio")), where="post", color="C4",
                  label="input/output ratio")
    ratio_ax.set_ylabel("input/output tokens")
    labels = ("token_budget", "prefill_priority", "arrival rate (req/s)")
    for ax, label in zip((budget_ax, priority_ax, context_ax), labels):
        ax.set_ylabel(label)
        _mark_events(ax, timeline)
    budget_ax.legend(loc="upper left", fontsize="small")
    handles = context_ax.get_legend_handles_labels()[0] + ratio_ax.get_legend_handles_labels()[0]
    context_ax.legend(handles=handles, loc="upper left", fontsize="small")
    context_ax.set_xlabel("seconds since the controller started")
    return _png(fig)


def _draft_length_png(points: list[SpeculationPoint]) -> str | None:
    """Each speculating window's mean draft length against its mean running requests: per verifying decode
    (k) and per decode (k = 0 included; below k where the load kept decodes from drafting)."""
    if not points:
        return None
    fig = Figure(figsize=(8, 4), layout="constrained")
    ax = fig.subplots()
    running = [p.running for p in points]
    ax.scatter(running, _nan([p.per_verify for p in points]), color="C0", label="per verifying decode (k)")
    ax.scatter(running, _nan([p.per_decode for p in points]), color="C1", marker="x", label="per decode")
    ax.set_xlabel("running requests (window mean)")
    ax.set_ylabel("drafted tokens")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize="small")
    return _png(fig)


def _nan(values: list[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def _series(timeline: tuple[Decision, ...], get: Callable[[Decision], Any]) -> list[float]:
    """One value per decision; NaN (a gap in the line) where it is missing or not a number."""
    values = [get(d) for d in timeline]
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan for v in values]


def _mark_events(ax: Axes, timeline: tuple[Decision, ...]) -> None:
    violated = [d.t for d in timeline if d.violated]
    changes = [d.t for prev, d in zip(timeline, timeline[1:]) if d.regime != prev.regime]
    if violated:
        ax.vlines(violated, 0, 1, transform=ax.get_xaxis_transform(), colors="C3", alpha=0.35,
                  label="SLO violated")
    if changes:
        ax.vlines(changes, 0, 1, transform=ax.get_xaxis_transform(), colors="0.4", linestyles="dotted",
                  label="regime change")


def _optuna_plots(r: RegimeReport) -> list[Plot]:
    """Optuna's optimization history and parameter importances, redrawn from the report's trials."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")   # headless: a display backend would want a screen and the main thread
    from optuna.exceptions import ExperimentalWarning
    from optuna.visualization import matplotlib as optuna_plots

    complete = [t for t in r.trials if t.state == "COMPLETE" and t.value is not None]
    varying = [p for p in r.distributions if len({repr(t.params.get(p)) for t in complete if p in t.params}) >= 2]
    history, importance = "Optimization history", "Parameter importances"
    with _PYPLOT_LOCK, warnings.catch_warnings(), matplotlib.rc_context():   # Optuna sets a global style
        warnings.simplefilter("ignore", ExperimentalWarning)   # experimental since Optuna 2.2, still there
        if not complete:
            return [Plot(history, None, "no completed trials yet"), Plot(importance, None, "no completed trials yet")]
        try:
            study = _study(r, complete)
        except ValueError as e:   # a param outside its recorded distribution: report it, draw nothing
            return [Plot(title, None, f"the trials could not be replayed into Optuna: {_first_line(e)}")
                    for title in (history, importance)]
        plots = [_optuna_plot(history, lambda: optuna_plots.plot_optimization_history(study))]
        if len(complete) < MIN_TRIALS_FOR_IMPORTANCE:
            plots.append(Plot(importance, None, f"needs at least {MIN_TRIALS_FOR_IMPORTANCE} completed trials, "
                                                f"has {len(complete)}"))
        elif not varying:
            plots.append(Plot(importance, None, "no knob took two distinct values in the completed trials"))
        else:
            plots.append(_optuna_plot(importance, lambda: optuna_plots.plot_param_importances(study, params=varying)))
    return plots


def _optuna_plot(title: str, draw: Callable[[], Any]) -> Plot:
    from matplotlib import pyplot as plt

    open_before = set(plt.get_fignums())
    try:
        ax = draw()
    except Exception as e:   # Optuna's own verdict (too few trials, a degenerate fit): a note, not a failed report
        for number in set(plt.get_fignums()) - open_before:
            plt.close(number)
        return Plot(title, None, f"Optuna could not draw it: {_first_line(e)}")
    fig = ax.figure
    try:
        fig.set_size_inches(8, 4)
        fig.tight_layout()    # after resizing, or long knob names are cut off
        return Plot(title, _png(fig))
    finally:
        plt.close(fig)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _study(r: RegimeReport, complete: list[TrialRow]) -> Any:
    """An in-memory study of the completed trials: Optuna's plots take a Study, and the report may have been
    parsed back from JSON, far from the database."""
    import logging

    import optuna
    from optuna.distributions import json_to_distribution
    from optuna.trial import create_trial

    # The in-memory storage announces every new study at INFO; a report is not news.
    logging.getLogger("optuna.storages._in_memory").setLevel(logging.WARNING)
    dists = {name: json_to_distribution(text) for name, text in r.distributions.items()}
    by_number = {t.number: t for t in complete}
    # Failed placeholders fill the numbers of the other trials, so the plots' trial axis reads as the tables do.
    study = optuna.create_study(direction="maximize", study_name=r.key)
    study.add_trials([create_trial(params=t.params, distributions={p: dists[p] for p in t.params}, value=t.value,
                                   constraints=t.constraints or None) if (t := by_number.get(n)) else
                      create_trial(state=optuna.trial.TrialState.FAIL) for n in range(max(by_number) + 1)])
    return study
