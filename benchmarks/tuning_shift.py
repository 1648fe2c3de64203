"""The tuner on the REAL daemon: a shifting workload (chat -> summarization -> chat) served by
autotuned-serve with online tuning, by the best single static configuration found offline, and by
vLLM-like defaults (sarathi = vLLM V1's chunked prefill, FCFS, token budget 2048 and 8192).

Each configuration gets its own daemon (bundled SmolLM2, fresh state dir, same port) and the same
seeded requests from the open-loop bench client; the daemons run one after another, never side by
side. "Best static" is the simulator's grid search (`autotuner.simulated_tuning.best_static`) on these
requests with the shipped cost model: found offline, as an operator would. Reported per
configuration: goodput (requests/s meeting both SLOs), SLO attainment, the share of 30-s bins
(by finish time) that broke the SLO, and for the tuned daemon its own tuning windows (controller).

    python benchmarks/tuning_shift.py --slo-ttft-s 8 --slo-tbt-s 0.5 --json out/tuning_shift.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import yaml

from bench_common import MachineInfo, emit_summary
from server_health import wait_healthy
from loadgen.bench_client import BenchOptions, BenchRun, make_prompts, run_bench
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from autotuner.search_space import load_search_space
from autotuner.simulated_tuning import VLLM_DEFAULTS, best_static, violating_bin_fraction
from simulation.cost_model_files import find_cost_model
from loadgen.workload import RequestSpec, generate, load_workload
from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from telemetry.window import meets_slo

HERE = Path(__file__).resolve().parent
TUNED_POLICY = "adaptive"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default=str(HERE / "shift_daemon.yaml"))
    p.add_argument("--qps", type=float, default=None, help="base rate (default: the workload's)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--configs", nargs="+", default=["tuned", "best_static", *VLLM_DEFAULTS],
                   help="which daemons to run, in this order")
    p.add_argument("--initial-budget", type=int, default=512, help="the tuned daemon's starting budget (the default)")
    p.add_argument("--port", type=int, default=8131)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def daemon_settings(name: str, static: dict, slo: SloClass, args: argparse.Namespace, state_dir: str) -> dict:
    """The daemon's YAML settings for one configuration."""
    common = {"port": args.port, "state_dir": state_dir, "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s}}
    if name == "tuned":
        return common | {"tune": True, "policy": TUNED_POLICY, "knobs": {"token_budget": args.initial_budget}}
    if name == "best_static":
        return common | {"tune": False, "policy": TUNED_POLICY, "knobs": static}
    policy, knobs = VLLM_DEFAULTS[name]
    return common | {"tune": False, "policy": policy,
                     "knobs": {"token_budget": knobs.token_budget, "max_num_seqs": knobs.max_num_seqs}}


def start_daemon(settings: dict, workdir: str) -> subprocess.Popen:
    config = os.path.join(workdir, "daemon.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(settings, f)
    log = open(os.path.join(workdir, "daemon.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "serving.cli", "serve", "--config", config],
                            stdout=log, stderr=subprocess.STDOUT)
    if wait_healthy(proc, f"http://127.0.0.1:{settings['port']}/health", 300, "the daemon", log.name):
        return proc
    proc.kill()
    raise RuntimeError(f"the daemon did not come up within 300 s; see {log.name}")


def stop_daemon(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


def from_start(record: RequestRecord, start: float) -> RequestRecord:
    """Client times from the run's start, so 30-s bins line up across configurations."""
    return replace(record, arrival=record.arrival - start,
                   first_token=None if record.first_token is None else record.first_token - start,
                   finished=record.finished - start, token_times=tuple(t - start for t in record.token_times))


def controller_windows(state_dir: str) -> dict:
    """The tuned daemon's own measured tuning windows and how many broke the SLO (decisions.jsonl)."""
    path = Path(state_dir) / "decisions.jsonl"
    decisions = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    measured = [d for d in decisions if d.get("violated") is not None]
    exploring = [d for d in measured if d["action"] in ("trial", "abort")]
    return {"tuning_windows": len(measured), "violating": sum(d["violated"] for d in measured),
            "exploring": len(exploring), "exploring_violating": sum(d["violated"] for d in exploring),
            "knobs": [(d["t"], d["action"], d["regime"], d["knobs"]["token_budget"],
                       round(d["knobs"]["prefill_priority"], 2), d["violated"]) for d in measured]}


def bench_daemon(settings: dict, workdir: str, specs: list[RequestSpec], prompts: list, slo: SloClass,
                 drain_s: float) -> tuple[BenchRun, list[RequestRecord]]:
    """A fresh daemon with `settings`, the requests sent open loop (unfinished `drain_s` after the
    last arrival: failed), the daemon stopped; the client's records timed from the run's start."""
    proc = start_daemon(settings, workdir)
    try:
        options = BenchOptions(f"http://127.0.0.1:{settings['port']}", max_duration_s=specs[-1].arrival_s + drain_s,
                               progress=False)
        run = run_bench(specs, prompts, options, slo)
    finally:
        stop_daemon(proc)
    return run, [from_start(r.record(run.start + options.max_duration_s), run.start) for r in run.results]


def run_one(name: str, specs: list[RequestSpec], prompts: list, static: dict, slo: SloClass,
            args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"tuning_shift_{name}_")
    state_dir = os.path.join(workdir, "state")
    run, records = bench_daemon(daemon_settings(name, static, slo, args, state_dir), workdir, specs, prompts, slo,
                                drain_s=600)
    good_by_phase = Counter(r.spec.phase for r, record in zip(run.results, records) if meets_slo(record, slo))
    result = {"goodput_rps": run.summary.goodput_rps, "slo_attainment": run.summary.slo_attainment,
              "violating_bin_fraction": violating_bin_fraction(records, slo),
              "ttft_p50_s": run.summary.ttft_p50_s, "tbt_p99_s": run.summary.tbt_p99_s,
              "failed": run.summary.num_failed, "good_by_phase": dict(good_by_phase), "workdir": workdir}
    if name == "tuned":
        result["controller"] = controller_windows(state_dir)
    print(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'controller'})}", file=sys.stderr)
    return result


def main() -> None:
    args = parse_args()
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    specs = generate(load_workload(args.workload), args.qps, duration_s=1e9, seed=args.seed)
    prompts = make_prompts(specs, PromptSource(load_prompt_tokenizer(None), args.seed), text=False)
    static, simulated = best_static(specs, find_cost_model(), load_search_space(max_token_budget=None),
                                    TUNED_POLICY, slo)
    results = {name: run_one(name, specs, prompts, static, slo, args) for name in args.configs}
    tuned = results.get("tuned", {}).get("goodput_rps")
    emit_summary({
        "machine": MachineInfo.collect().as_dict(), "workload": args.workload, "qps": args.qps,
        "num_requests": len(specs), "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
        "best_static_knobs": static, "best_static_simulated_goodput_rps": simulated.goodput_rps,
        "results": results,
        "ratio_tuned_over": {k: (tuned / r["goodput_rps"] if tuned is not None and r["goodput_rps"] else None)
                             for k, r in results.items() if k != "tuned"},
    }, args.json)


if __name__ == "__main__":
    main()
