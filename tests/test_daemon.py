"""The daemon as ops run it: a subprocess that drains on SIGTERM and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

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
