"""benchmarks/llama_cpp_capacity.py's server configs: which daemon runs with its tuner, and which
result is the best static token budget and the best untuned daemon (the live static grid)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name
import llama_cpp_capacity as capacity  # noqa: E402


def test_only_daemon_tuned_runs_with_its_tuner():
    args = capacity.parse_args(["--out-dir", "/tmp/unused", "--daemon-args=--config a.yaml"])
    specs = {name: capacity.daemon_spec(name, args, "m.gguf", 1, "state")
             for name in ("daemon", "daemon-tuned", "daemon-sarathi-64")}
    assert "--no-tune" in specs["daemon"].argv and "--no-tune" in specs["daemon-sarathi-64"].argv
    assert "--no-tune" not in specs["daemon-tuned"].argv
    assert specs["daemon-tuned"].config == "--config a.yaml"
    assert specs["daemon-sarathi-64"].config == "--no-tune --policy sarathi --token-budget 64 --config a.yaml"
    assert capacity.is_daemon_config("daemon-tuned") and not capacity.is_daemon_config("daemon-fast")


def result(name: str, qps: float | None) -> SimpleNamespace:
    server = "llama.cpp" if name.startswith("llama") else "autotuned-serve"
    return SimpleNamespace(spec=SimpleNamespace(name=name, server=server, config=name), capacity_qps=qps)


def test_the_best_static_budget_and_the_best_untuned_daemon_leave_out_the_tuned_daemon_and_llama_cpp():
    results = [result("llama-b32-np8", 5.0), result("daemon", 1.3), result("daemon-sarathi-64", 1.2),
               result("daemon-sarathi-128", None), result("daemon-tuned", 2.0)]
    assert capacity.best_static_daemon(results).spec.name == "daemon-sarathi-64"
    assert capacity.best_untuned_daemon(results).spec.name == "daemon"


def test_the_live_grid_gives_each_config_its_ratio_to_the_best_untuned_of_its_own_run(tmp_path: Path):
    def run(folder: str, *servers: tuple[str, float]) -> Path:
        path = tmp_path / folder / "llama_cpp_capacity.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"servers": [
            {"spec": {"name": name}, "capacity_qps": qps, "first_failing_qps": 2 * qps,
             "probes": [{"qps": qps, "passed": True, "ttft_p50_s": 0.5, "tbt_p99_s": 0.2}]}
            for name, qps in servers]}))
        return path
    table = capacity.render_live_grid([run("grid", ("daemon", 1.0), ("daemon-sarathi-64", 1.25), ("daemon-tuned", 1.25)),
                                       run("alone", ("daemon-deadline-64", 1.5))])
    ratios = {tuple(cell.strip() for cell in line.split("|")[1:3]): line.split("|")[-2].strip()
              for line in table.splitlines()[2:]}
    assert ratios == {("grid", "`daemon`"): "0.80", ("grid", "`daemon-sarathi-64`"): "1.00",
                      ("grid", "`daemon-tuned`"): "1.00", ("alone", "`daemon-deadline-64`"): "-"}


def test_the_bars_bound_llama_cpps_best_by_each_configurations_lowest_failing_rate(tmp_path: Path):
    def run(folder: str, gguf: str, *servers: tuple[str, float, list[tuple[float, bool]]]) -> Path:
        path = tmp_path / folder / "llama_cpp_capacity.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"gguf": f"/models/{gguf}", "servers": [
            {"spec": {"name": name, "server": "llama.cpp" if name.startswith("llama") else "autotuned-serve"},
             "capacity_qps": qps, "probes": [{"qps": rate, "passed": passed} for rate, passed in probes]}
            for name, qps, probes in servers]}))
        return path
    table = capacity.render_bars([
        run("daemon", "a.gguf", ("daemon", 1.6, [(0.8, True), (1.6, True), (3.2, False)])),
        run("grid", "a.gguf", ("llama-b32-np4", 0.0, [(1.6, False)]), ("llama-b64-np4", 0.0, [(1.2, False)])),
        run("search", "a.gguf", ("llama-b32-np4", 0.6, [(0.6, True), (0.8, False)])),   # lowers b32's bound
        run("other", "b.gguf", ("daemon", 0.6, [(0.6, True)]), ("llama-b32-np4", 0.3, [(0.3, True)]))])
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in table.splitlines()[2:]}
    # a.gguf: b32 failed 0.8, b64 1.2: llama.cpp's best lies below 1.2, the daemon held 1.6 (1.333...)
    assert rows["a.gguf"] == ["1.600", "2", "1.200", "> 1.33x"]
    # b.gguf: a configuration that never failed leaves the bound open
    assert rows["b.gguf"] == ["0.600", "1", "-", "-"]
