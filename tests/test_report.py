"""The tuning report, from a small tuner state written in the controller's format (docs/tuning.md)."""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from html.parser import HTMLParser

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState, create_trial

from autotuner.controller import paused_line
from autotuner.search_space import load_search_space
from policies import Knobs
from serving.cli import main
from serving.report import WINDOW_KEYS, TuningReport, build_report
from serving.report_render import render_csv, render_html, render_json

A, B = "io=2^3|rate=2^-1|kv=low", "io=2^0|rate=2^1|kv=high"
DISTS = {"token_budget": IntDistribution(32, 2048, log=True), "prefill_priority": FloatDistribution(0, 1),
         "max_num_seqs": IntDistribution(4, 256, log=True), "kv_admission_watermark": FloatDistribution(0, 0.2),
         "policy": CategoricalDistribution(("sarathi", "adaptive"))}
START = dict(token_budget=256, prefill_priority=0.2, max_num_seqs=64, kv_admission_watermark=0.01, policy="sarathi")
BEST = dict(token_budget=512, prefill_priority=0.5, max_num_seqs=128, kv_admission_watermark=0.05, policy="adaptive")
GREEDY = dict(token_budget=2048, prefill_priority=0.9, max_num_seqs=256, kv_admission_watermark=0.0, policy="sarathi")
SMALL = dict(token_budget=128, prefill_priority=0.1, max_num_seqs=32, kv_admission_watermark=0.1, policy="adaptive")
ABORTED = dict(token_budget=32, prefill_priority=1.0, max_num_seqs=4, kv_admission_watermark=0.2, policy="sarathi")


def window(goodput: float | None, attainment: float | None, ttft: float = 0.5, tbt: float = 0.1) -> dict:
    return {"ttft_p50_s": ttft, "tbt_p99_s": tbt, "goodput_rps": goodput, "slo_attainment": attainment,
            "arrival_rate_rps": 2.0, "output_tokens_per_s": 300.0, "input_output_ratio": 8.0,
            "kv_usage_mean": 0.4, "mfu": None, "mbu": None}


def logged_knobs(params: dict) -> dict:
    """The engine's Knobs as the controller logs them: every knob, no policy."""
    return {k: v for k, v in params.items() if k != "policy"} | {"max_partial_prefills": 4}


def trial(params: dict, value: float | None, constraints: list[float] | None, source: str = "live",
          state: TrialState = TrialState.COMPLETE, **attrs) -> optuna.trial.FrozenTrial:
    """A trial as the controller stores it: constraints in the `constraints` system attr (a list)."""
    return create_trial(state=state, value=value, params=params, distributions={k: DISTS[k] for k in params},
                        user_attrs={"source": source, "aborted": False, **attrs},
                        system_attrs={"constraints": constraints} if constraints is not None else None)


def write_state(state_dir) -> None:
    storage = f"sqlite:///{state_dir}/tuner.db"
    a = optuna.create_study(storage=storage, study_name=f"regime:{A}", direction="maximize")
    a.set_user_attr("regime", {"io_ratio_bucket": 3, "rate_bucket": -1, "kv": "low"})
    a.set_user_attr("created_at", "2026-01-05T10:00:00+00:00")
    a.add_trial(trial(START, 1.5, [-0.3, -0.05], "warm-start", window=window(1.5, 0.9)))             # 0
    a.add_trial(trial(GREEDY, 3.0, [0.4, -0.01], window=window(3.0, 0.4, ttft=2.4)))                  # 1
    a.enqueue_trial(BEST, user_attrs={"source": "live", "aborted": False, "window": window(2.0, 0.97)})
    best = a.ask(DISTS)                                                                               # 2
    best.set_constraint("ttft", -1.5)      # Optuna 5's per-key form must read the same as the list
    best.set_constraint("tbt", -0.1)
    a.tell(best, 2.0)
    a.add_trial(trial(ABORTED, None, None, state=TrialState.FAIL, aborted=True,
                      window=window(0.1, 0.2, ttft=6.0)))                                             # 3
    a.add_trial(trial({**BEST, "token_budget": 1024}, None, None, state=TrialState.FAIL,
                      rejected="outside trust region"))                                               # 4
    a.add_trial(trial(BEST, 1.9, [-1.4, -0.1], "recheck", window=window(1.9, 0.95)))                  # 5
    a.add_trial(trial(SMALL, 1.2, [-1.0, -0.2], window=window(1.2, 0.99)))                            # 6
    a.add_trial(trial(SMALL, None, None, state=TrialState.RUNNING))                                   # 7
    b = optuna.create_study(storage=storage, study_name=f"regime:{B}", direction="maximize")
    b.set_user_attr("regime", {"io_ratio_bucket": 0, "rate_bucket": 1, "kv": "high"})
    b.add_trial(trial(BEST, 4.0, [0.5, 0.0], "<script>x</script>", window=window(4.0, 0.6, ttft=2.5)))
    decisions = [
        (0, A, "regime", None, START, None, None), (1, A, "warm-start", None, START, None, None),
        (60, A, "trial", 0, START, window(1.5, 0.9), False), (120, A, "trial", 1, GREEDY, window(3.0, 0.4), True),
        (180, A, "trial", 2, BEST, window(2.0, 0.97), False), (210, A, "abort", 3, ABORTED, window(0.1, 0.2), True),
        (270, A, "incumbent", None, BEST, window(2.2, 0.99), False),
        (330, A, "recheck", 5, BEST, window(1.9, 0.95), False), (390, A, "trial", 6, SMALL, window(1.2, 0.99), False),
        (450, B, "drift", None, BEST, None, None), (510, B, "trial", 0, BEST, window(4.0, 0.6), True),
        (570, B, "pause", None, BEST, None, None)]
    with open(state_dir / "decisions.jsonl", "w") as f:
        for t, regime, action, number, params, win, violated in decisions:
            context = {"io_ratio": 8.0 if regime == A else 1.0, "arrival_rate_rps": 0.5 if regime == A else 2.0,
                       "kv_usage": 0.3}
            f.write(json.dumps({"t": t, "time": f"2026-01-05T10:{t // 60:02d}:00+00:00", "regime": regime,
                                "action": action, "trial": number, "knobs": logged_knobs(params), "context": context,
                                "window": win, "violated": violated}) + "\n")
        f.write('{"t": 580, "regime": "io=2^0|ra')       # torn by a crash mid-write


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("state")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    write_state(path)
    return path


@pytest.fixture(scope="module")
def report(state_dir) -> TuningReport:
    return build_report(str(state_dir))


@pytest.fixture(scope="module")
def html_run(state_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "sub" / "report.html"
    rc = main(["report", "--format", "html", "--out", str(out), "--state-dir", str(state_dir)])
    return rc, out.read_text(encoding="utf-8")


def test_chosen_is_the_best_feasible_trial_and_counts_include_dropped_ones(report):
    a, b = report.regimes
    assert a.key == A and a.regime["kv"] == "low" and b.key == B
    # not infeasible #1 (3.0); the value is the controller's: mean over its windows minus a noise margin
    # a study stored before the deadline knobs joined the space: the knobs it lacks take their defaults
    assert a.chosen.trial == 2 and a.chosen.params == load_search_space().snap(BEST) and 1.8 < a.chosen.value <= 2.0
    assert a.chosen.params["ttft_pace"] == Knobs().ttft_pace and a.chosen.params["token_budget"] == 512
    assert [t.number for t in a.trials] == [0, 1, 2, 3, 5, 6, 7]                     # rejected #4 not listed
    assert {t.number: t.feasible for t in a.trials} == {0: True, 1: False, 2: True, 3: None, 5: True, 6: True,
                                                         7: None}
    c = a.counts
    assert (c.total, c.complete, c.feasible, c.failed, c.aborted, c.rejected, c.running, c.warm_start,
            c.recheck) == (8, 5, 4, 1, 1, 1, 1, 1, 1)
    assert b.chosen is None and b.after is None


def test_before_is_the_first_window_and_after_the_chosen_configurations_windows(report):
    a, b = report.regimes
    assert (a.before.tuning_windows, a.before.goodput_rps, a.before.slo_attainment) == (1, 1.5, 0.9)
    assert a.before.knobs["token_budget"] == 256 and a.before.knobs["policy"] == "sarathi"   # from trial 0
    assert a.after.tuning_windows == 3    # trial 2, the incumbent window and the recheck; not the drift without a window
    assert math.isclose(a.after.goodput_rps, (2.0 + 2.2 + 1.9) / 3)
    assert math.isclose(a.after.slo_attainment, (0.97 + 0.99 + 0.95) / 3)
    assert (b.before.goodput_rps, b.before.slo_attainment) == (4.0, 0.6)


def test_timeline_and_violations(report):
    assert [d.t for d in report.timeline] == [0, 1, 60, 120, 180, 210, 270, 330, 390, 450, 510, 570]   # torn: dropped
    assert (report.tuning_windows, report.violated_tuning_windows) == (8, 3)
    assert report.violation_fraction == 3 / 8
    assert [(r.tuning_windows, r.violated_tuning_windows) for r in report.regimes] == [(7, 2), (1, 1)]


def test_without_a_decision_log_the_trials_windows_are_used(state_dir, tmp_path):
    shutil.copy(state_dir / "tuner.db", tmp_path / "tuner.db")
    a = build_report(str(tmp_path)).regimes[0]
    assert a.before.goodput_rps == 1.5 and a.after.tuning_windows == 2           # trials 2 and 5 ran BEST
    assert math.isclose(a.after.goodput_rps, (2.0 + 1.9) / 2)


def test_json_round_trips(report):
    text = render_json(report)
    assert TuningReport.from_dict(json.loads(text)) == report
    assert json.loads(text)["violation_fraction"] == 3 / 8


def test_csv_has_one_row_per_listed_trial(report):
    rows = list(csv.reader(io.StringIO(render_csv(report))))
    assert rows[0] == ["regime", "number", "source", "state", *DISTS, "value", "feasible", *WINDOW_KEYS]
    assert len(rows) == 1 + 7 + 1
    best = next(r for r in rows[1:] if r[:2] == [A, "2"])
    assert best[4:11] == ["512", "0.5", "128", "0.05", "adaptive", "2.0", "true"]


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [v or "" for k, v in attrs if k in ("src", "href")]


def test_html_is_standalone_and_shows_the_choice(html_run):
    rc, page = html_run
    assert rc == 0
    assert A in page and B in page and "token_budget=512, prefill_priority=0.5" in page
    assert page.count('src="data:image/png;base64,') >= 3     # timeline and each regime's optimization history
    assert "needs at least 4 completed trials" in page          # regime B: no importances
    assert "http://" not in page and "https://" not in page
    refs = _Refs()
    refs.feed(page)
    assert refs.refs and all(r.startswith(("data:image/png;base64,", "#")) for r in refs.refs)
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


def test_cli_writes_json_and_csv_to_stdout_and_files(state_dir, tmp_path, capsys):
    assert main(["report", "--format", "json", "--out", "-", "--state-dir", str(state_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["regimes"][0]["chosen"]["trial"] == 2
    out = tmp_path / "trials.csv"
    assert main(["report", "--format", "csv", "--out", str(out), "--state-dir", str(state_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(out)
    assert out.read_text().startswith("regime,number,source,state,token_budget")


@pytest.mark.parametrize("setup", ["missing", "empty", "empty-db"])
def test_no_state_is_a_one_line_error(tmp_path, capsys, setup):
    state = tmp_path / "state"
    if setup != "missing":
        state.mkdir()
    if setup == "empty-db":
        (state / "tuner.db").touch()
    assert main(["report", "--format", "json", "--out", str(tmp_path / "r.json"), "--state-dir", str(state)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"autotuned-serve: error: no tuner state in {state}: run the daemon or "
                   "`autotuned-serve tune --simulate` first")
    assert not (tmp_path / "r.json").exists()


def test_html_to_stdout_and_a_corrupt_log_are_refused(state_dir, tmp_path, capsys):
    assert main(["report", "--out", "-", "--state-dir", str(state_dir)]) == 2
    assert "give a file path for the html report" in capsys.readouterr().err
    (tmp_path / "decisions.jsonl").write_text('not json\n{"t": 1, "action": "pause"}\n')
    with pytest.raises(ValueError, match="decisions.jsonl:1: not a decision record"):
        build_report(str(tmp_path))


def append_failure_and_pause(state_dir, to) -> None:
    """`state_dir`'s state in `to`, its log (torn line dropped) followed by entries as the controller
    writes them: a failed warm start, and a measured window of regime B with exploration paused."""
    shutil.copy(state_dir / "tuner.db", to / "tuner.db")
    lines = (state_dir / "decisions.jsonl").read_text().splitlines()[:-1]
    failure = {"t": 575, "time": "2026-01-05T10:09:35+00:00", "regime": B, "action": "failure", "trial": None,
               "knobs": logged_knobs(BEST), "context": None, "window": None, "violated": None,
               "stage": "warm_start", "cause": "WarmStartFailed: search: No module named <loadgen>"}
    paused = {"t": 600, "time": "2026-01-05T10:10:00+00:00", "regime": B, "action": "recheck", "trial": None,
              "knobs": logged_knobs(BEST), "context": {"io_ratio": 1.0, "arrival_rate_rps": 2.0, "kv_usage": 0.3},
              "window": window(2.0, 0.99), "violated": False, "exploration": "paused", "held_attainment": 0.99}
    (to / "decisions.jsonl").write_text("\n".join([*lines, json.dumps(failure), json.dumps(paused)]) + "\n")


def test_failures_and_paused_exploration_are_reported(state_dir, tmp_path):
    """The tuner's failures (decision log "failure" entries) and a regime whose latest measured window
    paused exploration reach the report, its JSON and the HTML page (the cause escaped)."""
    append_failure_and_pause(state_dir, tmp_path)
    report = build_report(str(tmp_path))
    (failure,) = report.failures
    assert (failure.t, failure.time, failure.stage) == (575, "2026-01-05T10:09:35+00:00", "warm_start")
    assert failure.cause == "WarmStartFailed: search: No module named <loadgen>"
    a, b = report.regimes
    assert a.status is None
    assert b.status == paused_line(0.99) and "serving 99.0% of requests within the SLO: within 1.0%" in b.status
    assert TuningReport.from_dict(json.loads(render_json(report))) == report
    page = render_html(report)
    assert "<h2>Tuner failures</h2>" in page and "2026-01-05T10:09:35+00:00" in page
    assert "No module named &lt;loadgen&gt;" in page and "<loadgen>" not in page
    assert b.status in page


def with_old_window_keys(d: dict) -> dict:
    """A JSON report as rendered before the controller's windows were named tuning windows."""
    old = {"tuning_windows": "windows", "violated_tuning_windows": "violated_windows"}
    rename = lambda o: None if o is None else {old.get(k, k): v for k, v in o.items()}   # noqa: E731
    return {**rename(d), "regimes": [{**rename(r), "before": rename(r["before"]), "after": rename(r["after"])}
                                     for r in d["regimes"]]}


def test_a_log_without_failures_or_pauses_still_loads(report, html_run):
    """Logs written before failures and pauses were logged, and JSON reports rendered before the report
    carried them or named the tuning windows so, still load: no failures, no status, no failures section."""
    assert report.failures == () and all(r.status is None for r in report.regimes)
    assert all(d.held_attainment is None for d in report.timeline)
    old = json.loads(render_json(report))
    del old["failures"]
    for r in old["regimes"]:
        del r["status"]
    for d in old["timeline"]:
        del d["held_attainment"]
    assert TuningReport.from_dict(old) == report
    assert TuningReport.from_dict(with_old_window_keys(old)) == report
    assert "Tuner failures" not in html_run[1] and "exploration paused" not in html_run[1]


def speculating_window(running: float, drafted: float, per_verify: float | None, per_decode: float,
                       acceptance: float | None) -> dict:
    """A measured window's draft fields as the controller logs them (autotuner/controller.py)."""
    return window(2.0, 0.95) | {"num_running_mean": running, "draft_tokens_per_s": drafted,
                                "draft_acceptance_rate": acceptance, "draft_tokens_per_verify": per_verify,
                                "draft_tokens_per_decode": per_decode}


def write_speculation_log(state_dir, mode: str = "adaptive") -> None:
    """A heavy regime logged first, where the load mostly kept decodes from drafting; a light one where they
    drafted long; and a window of the light regime with speculation off, which the table leaves out."""
    knobs = logged_knobs(BEST) | {"speculative_tokens": 4, "speculative_mode": mode}
    entries = [("heavy", knobs, speculating_window(30.0, 0.0, None, 0.0, None)),
               ("heavy", knobs, speculating_window(34.0, 5.0, 1.0, 0.1, 0.5)),
               ("light", knobs, speculating_window(2.0, 40.0, 4.0, 3.5, 0.6)),
               ("light", knobs | {"speculative_tokens": 6}, speculating_window(3.0, 30.0, 2.0, 1.5, 0.8)),
               ("light", logged_knobs(BEST) | {"speculative_tokens": 0}, speculating_window(2.5, 0.0, None, 0.0, None))]
    with open(state_dir / "decisions.jsonl", "w") as f:
        for t, (regime, knobs, win) in enumerate(entries):
            f.write(json.dumps({"t": 60 * t, "regime": regime, "action": "trial", "trial": None, "knobs": knobs,
                                "context": {}, "window": win, "violated": False}) + "\n")


def test_the_speculation_table_sets_draft_lengths_and_acceptance_against_load(tmp_path):
    from serving.report_speculation import speculation_points, speculation_rows

    write_speculation_log(tmp_path)
    report = build_report(str(tmp_path))
    light, heavy = speculation_rows(report)                 # lightest load first
    assert (light.regime, light.windows, light.drafting, light.running) == ("light", 2, 2, 2.5)
    assert (light.per_decode, light.per_verify, light.acceptance) == pytest.approx((2.5, 3.0, 0.7))
    assert light.knobs == ("4 adaptive", "6 adaptive")
    assert (heavy.regime, heavy.windows, heavy.drafting, heavy.running) == ("heavy", 2, 1, 32.0)
    assert (heavy.per_decode, heavy.per_verify, heavy.acceptance) == pytest.approx((0.05, 1.0, 0.5))
    assert [(p.running, p.per_verify) for p in speculation_points(report)] == \
        [(30.0, None), (34.0, 1.0), (2.0, 4.0), (3.0, 2.0)]
    assert TuningReport.from_dict(json.loads(render_json(report))) == report
    section = render_html(report).split("<h2>Speculation</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<td class=\"text\">light</td>" in section and "70.0%" in section and "50.0%" in section
    assert section.index(">light<") < section.index(">heavy<")
    assert section.count('src="data:image/png;base64,') == 1    # draft length against load


def test_without_speculation_the_section_says_so(html_run):
    section = html_run[1].split("<h2>Speculation</h2>", 1)[1].split("<h2>", 1)[0]
    assert "No measured window ran speculative decoding" in section and "<img" not in section


def test_every_window_key_the_report_reads_is_one_the_controller_logs():
    from autotuner.controller import _window_dict
    from telemetry.window import TelemetryWindow

    logged = _window_dict(TelemetryWindow(clock=lambda: 10.0).window(10.0))
    assert set(WINDOW_KEYS) <= set(logged), sorted(set(WINDOW_KEYS) - set(logged))


def test_a_json_report_without_the_draft_keys_loads_and_renders(report):
    """Windows rendered before they carried running requests and draft fields read them as None."""
    drafts = {"num_running_mean", "draft_tokens_per_s", "draft_acceptance_rate", "draft_tokens_per_verify",
              "draft_tokens_per_decode"}
    old = json.loads(render_json(report))
    for w in [t["window"] for r in old["regimes"] for t in r["trials"]] + [d["window"] for d in old["timeline"]]:
        for key in drafts & set(w or ()):
            del w[key]
    assert TuningReport.from_dict(old) == report
    assert "<h2>Speculation</h2>" in render_html(TuningReport.from_dict(old))
