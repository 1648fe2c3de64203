"""What ops deploy (docs/deployment.md): the systemd unit, the container image and their shared config.

No systemd or Docker daemon runs here, so the unit's drain is tested with a plain process: its own
ExecStart line and config (its `model:` set to the tiny model, as a deployment sets its own), SIGTERM
as its KillSignal during an in-flight request; the request finishes, and the process exits 0 within the
unit's TimeoutStopSec."""

from __future__ import annotations

import configparser
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from serving.settings import load_settings

from tests.live_server import free_port, stream_completion, wait_healthy

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "deploy/autotuned-serve.service"
CONFIG = ROOT / "deploy/config.yaml"
GUIDE = ROOT / "docs/deployment.md"


def unit() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNIT)
    return parser["Service"]


def readme_commands() -> tuple[str, str]:
    """(install, test): the README's two set-up commands, as written there."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return blocks[0].strip(), blocks[1].strip()


def test_the_unit_restarts_on_failure_but_not_on_a_model_that_cannot_load():
    service = unit()
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2"          # serving/cli.py: 2 is a bad model or setting
    assert service["KillSignal"] == "SIGTERM" and service["Type"] == "exec"
    grace = load_settings(str(CONFIG), {}).grace_s            # the file's, else the default
    assert float(service["TimeoutStopSec"]) >= grace + 10      # the drain, then the exit, before SIGKILL
    assert "--config /etc/autotuned-serve/config.yaml" in service["ExecStart"]


def test_the_image_is_built_and_tested_by_the_readmes_commands():
    dockerfile = (ROOT / "Dockerfile").read_text()
    install, tests = readme_commands()
    assert f"RUN {install}\n" in dockerfile and f"RUN {tests}\n" in dockerfile
    final = dockerfile[dockerfile.rindex("\nFROM "):]          # the image that runs
    user = re.search(r"^USER (\S+)$", final, re.M)
    assert user and user.group(1) not in ("root", "0")
    assert "VOLUME /var/lib/autotuned-serve" in final and '"--state-dir", "/var/lib/autotuned-serve"' in final
    healthcheck = re.search(r"^HEALTHCHECK .*$", final.replace("\\\n", " "), re.M).group(0)   # continuations joined
    assert "/health" in healthcheck
    assert '"--config", "/opt/autotuned-serve/deploy/config.yaml"' in final


def test_the_config_names_the_model_and_the_guide_mounts_one():
    """deploy/config.yaml carries `model:` (null: the bundled model), and the deployment guide, found from
    the README in one click, shows a model volume and the `model:` line that serves it."""
    assert "model" in yaml.safe_load(CONFIG.read_text())
    assert load_settings(str(CONFIG), {}).model is None
    guide = GUIDE.read_text()
    assert "-v /srv/models:/models:ro" in guide and "\nmodel: /models/" in guide
    readme = (ROOT / "README.md").read_text()
    assert "(docs/deployment.md#container-and-systemd)" in readme
    assert "## Container and systemd" in guide and "deploy/autotuned-serve.service" in guide


def test_sigterm_as_the_unit_sends_it_lets_the_request_in_flight_finish_and_exits_0(tiny_hf, tmp_path):
    service = unit()
    argv = shlex.split(service["ExecStart"])
    assert argv[0].endswith("/.venv/bin/autotuned-serve")
    argv = [sys.executable, "-m", "serving.cli", *argv[1:]]
    config = tmp_path / "config.yaml"    # the tiny model for speed; host, grace_s, engine_stall_s as shipped
    config.write_text(CONFIG.read_text().replace("model: null", f"model: {tiny_hf[0]}", 1))
    assert load_settings(str(config), {}).model == tiny_hf[0]
    argv[argv.index("--config") + 1] = str(config)
    argv[argv.index("--state-dir") + 1] = str(tmp_path / "state")
    port = free_port()
    argv += ["--dtype", "fp32", "--no-calibrate", "--port", str(port)]
    env = {"AUTOTUNED_SERVE_API_KEY": "deploy-test-key", "PATH": "/usr/bin:/bin"}   # as its EnvironmentFile
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        chunks: list[dict] = []
        client = threading.Thread(target=stream_completion, args=(url, chunks, env["AUTOTUNED_SERVE_API_KEY"]))
        client.start()
        while not chunks and client.is_alive():
            time.sleep(0.005)
        proc.send_signal(getattr(signal, service["KillSignal"]))
        stopped = time.monotonic()
        client.join(60)
        assert proc.wait(float(service["TimeoutStopSec"])) == 0
        assert time.monotonic() - stopped < load_settings(str(config), {}).grace_s
        assert chunks and chunks[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
