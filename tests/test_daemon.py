"""The daemon as ops run it: a subprocess that drains on SIGTERM and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from autotuner.controller import ControllerSettings
from autotuner.search_space import CONFIG
from autotuner.tuner_service import TUNING_CONFIG_ENV
from engine.engine_config import EngineConfig
from serving.api_server import ApiConfig
from serving.daemon import build_daemon, engine_loader
from serving.daemon_config import DaemonConfig
from tests.live_server import free_port, stream_completion, wait_healthy


def test_sigterm_lets_in_flight_requests_finish_and_exits_zero(tiny_hf, tmp_path):
    port = free_port()
    # --no-calibrate: no cost model describes the tiny model, and its start-up calibration is
    # tested in test_calibrate; here it would only lengthen the start
    proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "serve", "--model", tiny_hf[0], "--dtype", "fp32",
                             "--port", str(port), "--grace-s", "20", "--state-dir", str(tmp_path), "--no-calibrate"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        chunks: list[dict] = []
        client = threading.Thread(target=stream_completion, args=(url, chunks))
        client.start()
        started = time.monotonic() + 60
        while not chunks:
            assert client.is_alive() and time.monotonic() < started, "no token streamed"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        client.join(60)
        assert proc.wait(60) == 0
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_model_that_fails_to_load_exits_non_zero_with_a_one_line_reason(tmp_path):
    """Not /health 503 for ever: a supervisor sees the exit, a person reads why on the last line."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all" * 100)
    proc = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--model", str(broken), "--port",
                           str(free_port()), "--state-dir", str(tmp_path), "--no-calibrate"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("autotuned-serve: error: cannot load model broken: cannot read GGUF file"), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("tune", [True, False])
def test_the_engines_error_budget_spends_over_the_controllers_context_window(tiny_hf, tmp_path, monkeypatch,
                                                                             tune):
    """The deadline policy's error budget and the tuner's windows read the same horizon: the
    controller's context_window_s as configured (the tuning config's, here 45 s), tuning or not; the
    warm start's simulations spend it over the same horizon."""
    tuning = yaml.safe_load(Path(CONFIG).read_text())
    tuning["controller"] = (tuning.get("controller") or {}) | {"context_window_s": 45.0}
    path = tmp_path / "tuning.yaml"
    path.write_text(yaml.safe_dump(tuning))
    monkeypatch.setenv(TUNING_CONFIG_ENV, str(path))
    config = DaemonConfig(EngineConfig(model=tiny_hf[0], dtype="fp32", num_kv_blocks=64, block_size=4),
                          ApiConfig(served_model_name="tiny"), peak_flops=1e12, peak_bandwidth=1e11, tune=tune,
                          calibrate=False, state_dir=str(tmp_path / "state"))
    daemon = build_daemon(config)
    try:
        engine = engine_loader(config, daemon.telemetry, daemon.tuner)()
        horizon = engine.scheduler.error_budget.horizon_s
        assert horizon == ControllerSettings.load(path).context_window_s == 45.0
        if tune:     # and the warm start simulates the engine with that horizon
            assert daemon.tuner.controller.warm_start.error_budget_horizon_s == 45.0
    finally:
        for part in (daemon.tuner, daemon.telemetry.sampler):
            if part:
                part.stop()
