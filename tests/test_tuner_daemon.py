"""The tuner inside a live daemon: it tunes under traffic, obeys pause/pin/resume on /admin/tuning,
exports its report and metrics, and a failing controller never stops serving."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from optuna.trial import TrialState
from prometheus_client.parser import text_string_to_metric_families

from serving.cli import main
from autotuner.controller import ControllerSettings
from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from autotuner.tuner_service import TunerService
from serving.api_server import ApiConfig
from engine.engine_config import EngineConfig
from telemetry.window import SLO
from tests.conftest import make_engine
from tests.live_server import LiveServer

WINDOWS = dict(min_window_s=1.0, max_window_s=2.0, context_window_s=2.0, min_requests=2, min_tbt_samples=10,
               warm_start_trials=0, nothing_to_win=1.01)   # the tiny model meets the SLO: explore anyway


@pytest.fixture(scope="module")
def daemon(tiny_hf, tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("state")
    api = ApiConfig(served_model_name="tiny")
    config = DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11, slo=SLO(2.0, 0.25))
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


def send_traffic(url: str, stop: threading.Event) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    i = 0
    while not stop.is_set():
        try:
            client.completions.create(model="tiny", prompt=f"w{i % 50} w3 w4 w5", max_tokens=8,
                                      extra_body={"ignore_eos": True})
        except openai.APIError:
            pass
        i += 1


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
