"""The tuner's SQLite storage corrupt, locked or read-only: the daemon serves on its configured knobs,
says why once (log, /metrics' autotuned:tuner_failures_total{stage="storage"}, `tuner status`) and
does not crash; a storage that opens again later gets the tuner going."""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client import CollectorRegistry

import autotuner.tuner_service as tuner_service
from autotuner.controller import ControllerSettings
from autotuner.tuner_service import TunerService
from autotuner.tuner_state import TunerState
from loadgen.workload import generate, load_workload
from policies import Knobs
from serving.cli import main
from engine.slo_class import SloClass
from telemetry.window import TelemetryWindow
from tests.live_server import free_port
from simulation.cost_model import CostModel
from tests.test_controller import sim_controller

ROOT = Path(__file__).resolve().parent.parent
SLO_ = SloClass(ttft_s=2.0, tbt_s=0.25)


def storage_failures(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("autotuned:tuner_failures_total", {"stage": "storage"})


def stub_engine():
    """What TunerService.start reads of an engine when no traffic comes."""
    return SimpleNamespace(step_listeners=[], scheduler=SimpleNamespace(latest_knobs=Knobs()),
                           block_manager=SimpleNamespace(num_blocks=728, block_size=16),
                           model_config=SimpleNamespace(window=None))


def test_a_corrupt_storage_leaves_the_daemon_serving_and_says_why_once(tiny_hf, tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "tuner.db").write_bytes(b"this is not an SQLite file" * 200)
    port, log = free_port(), tmp_path / "daemon.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "serve", "--model", tiny_hf[0], "--dtype", "fp32",
                                 "--port", str(port), "--state-dir", str(state), "--no-calibrate", "--token-budget",
                                 "96"], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        for _ in range(3):
            done = httpx.post(url + "/v1/completions", json={"prompt": "w5 w6", "max_tokens": 4, "ignore_eos": True},
                              timeout=30)
            assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
        scheduler = httpx.get(url + "/admin/scheduler").json()
        assert scheduler["knobs"]["token_budget"] == 96                       # the configured knobs
        metrics = httpx.get(url + "/metrics").text
        assert 'autotuned:tuner_failures_total{stage="storage"} 1.0' in metrics
        assert main(["tuner", "status", "--url", url]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["running"] is False and "file is not a database" in status["storage_error"]
        assert status["exploration"].startswith("off: the tuner's storage does not open")
        said = [line for line in log.read_text().splitlines() if "file is not a database" in line]
        assert len(said) == 1 and "ERROR" in said[0] and "serving on the configured knobs" in said[0], said
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_locked_storage_is_said_once_and_tuning_starts_when_the_lock_clears(tmp_path, monkeypatch, caplog):
    TunerState(tmp_path)                                 # a valid store...
    holder = sqlite3.connect(tmp_path / "tuner.db")
    holder.execute("BEGIN EXCLUSIVE")                    # ...that another process holds locked
    monkeypatch.setattr(tuner_service, "STORAGE_RETRY_S", 0.2)
    registry = CollectorRegistry()
    tuner = TunerService(str(tmp_path), SLO_, registry, 512, ControllerSettings.load(background=False))
    try:
        with caplog.at_level(logging.INFO, logger="autotuner.tuner_service"):
            tuner.start(stub_engine(), TelemetryWindow(SLO_))      # waits out SQLite's 5 s busy timeout once
            status = tuner.status()
            assert "database is locked" in status["storage_error"] and storage_failures(registry) >= 1
            holder.rollback()
            holder.close()
            deadline = time.monotonic() + 30
            while tuner.controller is None:
                assert time.monotonic() < deadline, tuner.status()
                time.sleep(0.05)
        said = [r for r in caplog.records if "database is locked" in r.getMessage()]
        assert len(said) == 1 and said[0].levelname == "ERROR"
        assert any("opens again" in r.getMessage() for r in caplog.records)
        assert tuner.status()["running"] and "storage_error" not in tuner.status()
    finally:
        tuner.stop()


def test_a_storage_turned_read_only_while_tuning_holds_the_last_good_knobs(cost, tmp_path, caplog):
    """SQLite opened read-only (what a read-only disk gives: "attempt to write a readonly database") and a
    decision log that cannot be written: every window fails on the storage, the reason is logged once,
    each failure is counted, `tuner status` says so, the engine keeps its knobs and serving goes on."""
    TunerState(tmp_path)
    (tmp_path / "decisions.jsonl").mkdir()                 # appending to it fails as on a full or read-only disk
    specs = generate(load_workload("chat"), qps=1.0, duration_s=300, seed=6)
    sim, target, controller = sim_controller(cost, tmp_path, Knobs(token_budget=256))
    controller.state = TunerState(tmp_path, seed=0, storage=f"sqlite:///file:{tmp_path / 'tuner.db'}?mode=ro&uri=true")
    records: list = []
    sim.finish_listeners.append(records.append)
    sim.submit(specs)
    knobs_before = target.knobs()
    stop, windows = NoWait(), []
    original_step = controller.step

    def step():
        windows.append(1)
        if len(windows) >= 30 or controller.failures.count("storage") >= 3:
            stop.set()
        original_step()

    controller.step = step
    with caplog.at_level(logging.DEBUG, logger="autotuner"):
        controller.run(stop)
    failures = controller.failures.as_dict()
    assert failures["storage"]["count"] >= 2
    assert "attempt to write a readonly database" in failures["storage"]["last_cause"]
    said = [r.levelname for r in caplog.records if "readonly database" in r.getMessage()]
    assert said == ["ERROR", "INFO"], said          # the error and its decision once, not a line a window
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r for r in errors if "readonly database" in r.getMessage()].__len__() == 1, [r.getMessage() for r in errors]
    assert [r for r in errors if "decisions.jsonl" in r.getMessage()].__len__() == 1
    assert controller.storage_failing and target.knobs() == knobs_before
    assert tuner_service.exploration_status(controller).startswith("held: its storage fails")
    sim.run()
    assert len(records) == len(specs)                      # serving went on


class NoWait(threading.Event):
    """The run loop's pause after a failed window, skipped: the simulator's clock is the one that matters."""

    def wait(self, timeout: float | None = None) -> bool:
        return self.is_set()


@pytest.fixture(scope="module")
def cost():
    return CostModel((0.03, 1.2e-3, 0.0, 3e-4, 4.6e-6, 1e-8, 5e-4), kv_blocks=728, block_size=16)   # test_controller's
