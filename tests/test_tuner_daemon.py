"""The tuner inside a live daemon: it tunes under traffic, obeys pause/pin/resume on /admin/tuning,
exports its report and metrics, a failing controller never stops serving, and its warm start runs
from any working directory (or, failing, is counted on /metrics)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest
import yaml
from optuna.trial import TrialState
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from serving.cli import main, served_model_name
from autotuner.controller import ControllerSettings
from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from autotuner.search_space import CONFIG
from autotuner.tuner_service import TUNING_CONFIG_ENV, TunerService
from serving.api_server import ApiConfig
from engine.engine_config import EngineConfig
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow
from tests.conftest import make_engine
from policies import Knobs
from tests.live_server import LiveServer, free_port

SLO_ = SloClass(ttft_s=2.0, tbt_s=0.25)
WINDOWS = dict(min_window_s=1.0, max_window_s=2.0, context_window_s=2.0, min_requests=2, min_tbt_samples=10,
               warm_start_trials=0, nothing_to_win=1.01)   # the tiny model meets the SLO: explore anyway
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("autotuner", "engine", "policies", "serving", "cluster", "simulation", "telemetry", "loadgen")


@pytest.fixture(scope="module")
def daemon(tiny_hf, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("state")
    api = ApiConfig(served_model_name="tiny")
    config = DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11, slo=SLO_)
    telemetry = DaemonTelemetry(config)
    tuner = TunerService(str(state_dir), config.slo, telemetry.metrics.registry, max_token_budget=256,
                         settings=ControllerSettings.load(**WINDOWS))

    def load():
        engine = telemetry.attach(make_engine(tiny_hf[0], token_budget=32))
        # the tuned knobs of every step the engine ran (read on its own thread, where they are applied)
        engine.step_listeners.append(lambda record: RAN.add(tuned(engine.scheduler.knobs.as_dict(), tuner)))
        tuner.start(engine, telemetry.window)
        return engine

    with LiveServer(load, api, extra_routes(telemetry, tuner)) as server:
        stop = threading.Event()
        traffic = threading.Thread(target=send_traffic, args=(server.url, stop), daemon=True)
        traffic.start()
        yield server, tuner, state_dir
        stop.set()
        traffic.join(30)
        tuner.stop()


def send_traffic(url: str, stop: threading.Event, model: str = "tiny", pause_s: float = 0.0) -> None:
    """Requests one after another until `stop`, `pause_s` apart (0: saturating the engine)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    i = 0
    while not stop.is_set():
        try:
            client.completions.create(model=model, prompt=f"w{i % 50} w3 w4 w5", max_tokens=8,
                                      extra_body={"ignore_eos": True})
        except openai.APIError:
            pass
        i += 1
        stop.wait(pause_s)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


RAN: set[tuple] = set()


def tuned(values: dict, tuner: TunerService) -> tuple:
    return tuple(values[r.name] for r in tuner.space.ranges)


def test_tuner_runs_trials_under_traffic(daemon):
    """Trials complete on measured windows and change what the engine runs: the engine ran steps
    on every completed trial's knobs (two different ones at least), and once paused, the status and
    the decision counter count exactly the study's measured windows and the ones that missed the SLO."""
    server, tuner, _ = daemon
    controller = tuner.controller

    def completed():
        return controller.study.get_trials(states=(TrialState.COMPLETE,)) if controller.study else []

    wait_for(lambda: len({tuned(t.params, tuner) for t in completed()}) >= 2, timeout=240)
    assert httpx.post(server.url + "/admin/tuning/pause").json()["paused"] is True
    try:
        wait_for(lambda: not controller.study.get_trials(states=(TrialState.RUNNING,)))
        time.sleep(1.0)                                # the step that saw the pause returns
        trials = completed()
        for t in trials:
            assert tuned(tuner.space.snap(t.params), tuner) in RAN, (t.number, t.params)
        status = httpx.get(server.url + "/admin/tuning").json()
        assert status["running"] and status["paused"] and status["regime"] == controller.regime.key
        assert status["windows"] == controller.windows == len(trials)
        missed = sum(any(v > 0 for v in t.constraints.values()) for t in trials)
        assert status["violating_windows"] == controller.violations == missed
        assert status["incumbent"] == controller.incumbent()
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
        told = {s.labels["action"]: s.value for s in families["autotuned:tuner_decisions"].samples
                if s.name.endswith("_total")}
        assert sum(told.get(a, 0) for a in ("trial", "recheck", "abort")) == len(trials)
    finally:
        assert httpx.post(server.url + "/admin/tuning/resume").json()["paused"] is False


def test_pause_pin_resume(daemon):
    server, tuner, _ = daemon
    assert httpx.post(server.url + "/admin/tuning/pause").json()["paused"] is True
    pinned = httpx.post(server.url + "/admin/tuning/pin", json={"knobs": {"token_budget": 64}}).json()
    assert pinned["pinned"]["token_budget"] == 64
    wait_for(lambda: server.engine.scheduler.knobs.token_budget == 64)
    time.sleep(3)                                      # the paused tuner changes nothing meanwhile
    assert server.engine.scheduler.knobs.token_budget == 64
    bad = httpx.post(server.url + "/admin/tuning/pin", json={"knobs": {"token_budget": 100000}})
    assert bad.status_code == 400 and "token_budget" in bad.json()["error"]["message"]
    assert server.engine.scheduler.knobs.token_budget == 64
    assert httpx.post(server.url + "/admin/tuning/resume").json()["paused"] is False


def test_report_and_metrics(daemon):
    server, tuner, state_dir = daemon
    wait_for(lambda: any(t.state.name == "COMPLETE" for t in tuner.controller.study.trials))
    # built in a lowest-priority process: slow beside this saturated engine
    report = httpx.get(server.url + "/admin/tuning/report", params={"format": "json"}, timeout=120)
    assert report.status_code == 200 and report.json()["regimes"]
    html = httpx.get(server.url + "/admin/tuning/report", params={"format": "html"}, timeout=120).text
    assert "data:image/png;base64," in html
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    assert "autotuned:tuner_decisions" in families and "autotuned:tuner_applied_knob" in families
    lines = (state_dir / "decisions.jsonl").read_text().splitlines()
    assert {json.loads(line)["action"] for line in lines} >= {"regime", "pause", "pin", "resume"}


def test_controller_crash_leaves_serving_intact(daemon):
    server, tuner, _ = daemon
    controller = tuner.controller
    original = controller.target.window

    def broken(seconds):
        raise RuntimeError("telemetry exploded")

    knobs_before = server.engine.scheduler.latest_knobs
    controller.target.window = broken
    try:
        time.sleep(2)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        out = client.completions.create(model="tiny", prompt="w1 w2", max_tokens=4, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 4
        assert tuner.status()["running"]                         # the thread logged it and carried on
        assert server.engine.scheduler.latest_knobs.token_budget in (knobs_before.token_budget,
                                                                     controller.last_good.token_budget)
    finally:
        controller.target.window = original


def test_tuner_cli_talks_to_the_daemon(daemon, capsys):
    server, _, _ = daemon
    assert main(["tuner", "status", "--url", server.url]) == 0
    assert json.loads(capsys.readouterr().out)["running"] is True
    assert main(["tuner", "pin", "--url", server.url, "--knob", "token_budget=0"]) == 2
    assert "400" in capsys.readouterr().err
    assert main(["tuner", "resume", "--url", server.url]) == 0


def warm_start_settings(path: Path) -> Path:
    """The shipped tuning.yaml with the tests' short windows and a one-trial warm start, in the background."""
    config = yaml.safe_load(Path(CONFIG).read_text())
    # a 3 s context holds the 5 finished requests a warm start needs at the paced traffic's rate
    config["controller"] = config.get("controller", {}) | WINDOWS | dict(
        context_window_s=3.0, warm_start_trials=1, warm_start_enqueue=1, background=True)
    path.write_text(yaml.safe_dump(config))
    return path


def decisions(state_dir: Path) -> list[dict]:
    """The daemon's decision log so far; a line it is writing (no newline yet) left out."""
    path = state_dir / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]] if path.exists() else []


def up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_the_daemon_warm_starts_from_a_directory_shadowing_its_packages(tiny_hf, tmp_path):
    """A daemon started from a directory holding a module named after each of our packages still
    warm-starts in its background process (`python -m` had put that directory first on the child's
    path: a user's loadgen.py failed every warm start)."""
    cwd, state = tmp_path / "work", tmp_path / "state"
    cwd.mkdir()
    for name in PACKAGES:
        (cwd / f"{name}.py").write_text("raise ImportError('the working directory was imported')\n")
    # PYTHONPATH: the project importable from there without its editable install
    env = os.environ | {TUNING_CONFIG_ENV: str(warm_start_settings(tmp_path / "tuning.yaml")),
                        "PYTHONPATH": str(ROOT)}
    port, log = free_port(), (tmp_path / "daemon.log").open("w")
    # -P: the daemon itself must not import the shadowing modules (as its console script does not)
    proc = subprocess.Popen([sys.executable, "-P", "-m", "serving.cli", "serve", "--model", tiny_hf[0], "--dtype",
                             "fp32", "--port", str(port), "--state-dir", str(state), "--no-calibrate"],
                            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url, stop = f"http://127.0.0.1:{port}", threading.Event()
    # paced: the warm start's child runs at the lowest priority, starved beside a saturated engine
    traffic = threading.Thread(target=send_traffic, args=(url, stop, served_model_name(tiny_hf[0]), 0.25),
                               daemon=True)
    try:
        wait_for(lambda: proc.poll() is None and up(url))
        traffic.start()
        wait_for(lambda: {"warm-start", "failure"} & {d["action"] for d in decisions(state)})
        failures = [d["cause"] for d in decisions(state) if d["action"] == "failure"]
        errors = [line for line in (tmp_path / "daemon.log").read_text().splitlines() if "Error" in line]
        assert not failures, (failures, errors[-5:])
        assert "warm-start" in {d["action"] for d in decisions(state)}
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        traffic.join(30)
        log.close()


def test_a_failing_warm_start_is_counted_on_metrics_and_in_status(tmp_path, monkeypatch):
    """A warm start whose background process dies: counted once on /metrics'
    autotuned:tuner_failures_total{stage="warm_start"} (the sample stage shown at 0 from the start)
    and in `tuner status`."""
    monkeypatch.setattr("autotuner.background.child_command", lambda: [sys.executable, "-c", "raise SystemExit(3)"])
    registry = CollectorRegistry()
    tuner = TunerService(str(tmp_path), SLO_, registry, 512, ControllerSettings.load(background=True))
    engine = SimpleNamespace(step_listeners=[], scheduler=SimpleNamespace(latest_knobs=Knobs()),
                             block_manager=SimpleNamespace(num_blocks=728, block_size=16),
                             model_config=SimpleNamespace(window=None))
    tuner.start(engine, TelemetryWindow(SLO_))
    tuner.stop()                         # the controller is driven here, not by its thread (it saw no traffic)
    assert not tuner.status()["running"]
    tuner.stop_event.clear()             # set, it would interrupt the background run
    controller = tuner.controller
    # stand-in inputs (recent requests): the child fails before it reads them
    monkeypatch.setattr(controller.warm_start, "job", lambda observed: SimpleNamespace(trials=2, lengths=[],
                                                                                   cost=SimpleNamespace(step_scatter=())))
    assert controller._warm_start_picks(SimpleNamespace(key="io=2^0|rate=2^0|kv=low"), None) == []
    sample = lambda stage: registry.get_sample_value("autotuned:tuner_failures_total", {"stage": stage})  # noqa: E731
    assert sample("warm_start") == 1 and sample("sample") == 0
    failures = tuner.status()["failures"]
    assert list(failures) == ["warm_start"] and failures["warm_start"]["count"] == 1
    assert "exit code 3" in failures["warm_start"]["last_cause"]
