"""Goodput under load with speculative decoding: the step loop's choice of draft length against no
speculation and each fixed length, side by side at fractions of the no-speculation capacity
(docs/speculation.md#under-load).

The sustained capacity is measured first with speculation off (`loadgen.capacity`, the criteria of
`autotuned-serve capacity`); then open-loop Poisson arrivals at each --levels fraction of it run for
--duration-s under each configuration: `off`, `fixed-K` (every decode verifies all the drafter offers,
up to K) and `adaptive-K` (the priced choice, at most K). Goodput counts requests within the SLO per
second of arrivals. Live, --runs rounds alternate the configurations' order and the median goodput of
the rounds counts; the capacity with adaptive speculation is searched too, for the gain.

Simulated, on the CPU calibration and GPU hardware profiles (the speculator runs in the simulator with
the live-measured acceptance of configs/speculation.yaml):

    python benchmarks/speculation_sweep.py --simulate --targets cpu,h100-llama3.1-8b \\
        --workloads code-editing,chat --out docs/results/speculation_sweep/simulated.json

Live, against a daemon this script starts (the bundled model unless --model):

    python benchmarks/speculation_sweep.py --workloads code-editing --duration-s 120 --runs 1 \\
        --out docs/results/speculation_sweep/live_135m.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from results_file import meta
from server_health import running
from engine.outputs import RequestRecord
from engine.slo_class import SloClass
from loadgen.bench_client import BenchOptions, live_probe, make_prompts, run_bench
from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import generate, load_workload
from policies import Knobs
from simulation.cost_model_files import resolve_cost_model
from simulation.speculation_model import workload_speculation
from simulation.workload_run import make_simulator, simulated_probe
from telemetry.window import meets_slo

CPU_TARGET = "cpu"
GPU_TBT_S = 0.1
CONFIGS = "off,fixed:2,fixed:4,fixed:8,adaptive:8"


def config_knobs(spec: str) -> dict[str, dict[str, Any]]:
    """`off,fixed:4,adaptive:8` -> knob sets by name."""
    configs = {}
    for item in spec.split(","):
        mode, _, k = item.partition(":")
        configs["off" if mode == "off" else f"{mode}-{k}"] = (
            {"speculative_tokens": 0} if mode == "off" else {"speculative_tokens": int(k), "speculative_mode": mode})
    return configs


@dataclass(frozen=True)
class RunResult:
    level: float
    rps: float
    config: str
    run: int
    requests: int
    goodput_rps: float             # within SLO per second of arrivals


def goodput(records: list[RequestRecord], slo: SloClass, duration_s: float) -> float:
    return sum(meets_slo(r, slo) for r in records) / duration_s


# -- simulated --
def simulated_series(target: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    cost = resolve_cost_model() if target == CPU_TARGET else resolve_cost_model(profile=target)
    slo = SloClass(ttft_s=2.0, tbt_s=0.25 if target == CPU_TARGET else GPU_TBT_S)
    speculation = workload_speculation(workload)
    configs = config_knobs(args.configs)

    def capacity_of(knobs: dict[str, Any]) -> float:
        probe = simulated_probe(load_workload(workload), cost, "deadline", Knobs(**knobs), slo, 200, args.seed,
                                120.0, speculation)
        return search_capacity(probe, CapacityCriteria(slo.ttft_s, slo.tbt_s), start_qps=args.start_qps,
                               max_probes=12).capacity_qps

    capacity = capacity_of(configs["off"])
    rows = []
    for level in args.levels:
        specs = generate(load_workload(workload), qps=level * capacity, duration_s=args.duration_s, seed=args.seed)
        for name, knobs in configs.items():
            sim = make_simulator(cost, "deadline", Knobs(**knobs), slo, speculation=speculation)
            records: list[RequestRecord] = []
            sim.finish_listeners.append(records.append)
            sim.submit(specs)
            sim.run()
            rows.append(RunResult(level, level * capacity, name, 0, len(records),
                                  goodput(records, slo, args.duration_s)))
    adaptive = next((k for n, k in configs.items() if n.startswith("adaptive")), None)
    return {"target": target, "workload": workload, "slo": asdict(slo), "speculation": asdict(speculation),
            "capacity_rps": capacity, "adaptive_capacity_rps": capacity_of(adaptive) if adaptive else None,
            "runs": [asdict(r) for r in rows]}


# -- live --
def live_series(args: argparse.Namespace, workload: str) -> dict[str, Any]:
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    source = PromptSource(load_prompt_tokenizer(args.model), args.seed)
    configs = config_knobs(args.configs)
    url = f"http://127.0.0.1:{args.port}"
    rows: list[RunResult] = []
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-P", "-m", "serving.cli", "serve", "--host", "127.0.0.1", "--port", str(args.port),
               "--no-tune", "--state-dir", state, *args.daemon_args]
        with running(cmd, url + "/health", f"{state}.log", "autotuned-serve"):
            options = BenchOptions(url, max_duration_s=args.duration_s + args.drain_s, progress=False)

            def capacity_of(knobs: dict[str, Any]) -> float:
                set_knobs(url, knobs)
                probe = live_probe(load_workload(workload), source, options, slo, 20, args.seed, 120.0)
                return search_capacity(probe, CapacityCriteria(slo.ttft_s, slo.tbt_s), start_qps=args.start_qps,
                                       max_probes=args.max_probes).capacity_qps

            capacity = args.capacity_rps or capacity_of(configs["off"])
            print(f"{workload}: capacity {capacity:.3f} req/s", file=sys.stderr, flush=True)
            for run in range(args.runs):
                order = list(configs.items()) if run % 2 == 0 else list(reversed(configs.items()))
                for level in args.levels:
                    specs = generate(load_workload(workload), qps=level * capacity, duration_s=args.duration_s,
                                     seed=args.seed + run)
                    for name, knobs in order:
                        set_knobs(url, knobs)
                        bench = run_bench(specs, make_prompts(specs, source, options.sends_text), options, slo)
                        records = [r.record(bench.start + 1e9) for r in bench.results if r.status == 200]
                        rows.append(RunResult(level, level * capacity, name, run, len(bench.results),
                                              goodput(records, slo, args.duration_s)))
                        print(json.dumps(asdict(rows[-1])), file=sys.stderr, flush=True)
            adaptive = next((k for n, k in configs.items() if n.startswith("adaptive")), None)
            adaptive_capacity = capacity_of(adaptive) if adaptive and args.adaptive_capacity else None
    return {"target": args.model or "bundled", "workload": workload, "slo": asdict(slo), "capacity_rps": capacity,
            "adaptive_capacity_rps": adaptive_capacity, "runs": [asdict(r) for r in rows]}


def set_knobs(url: str, knobs: dict[str, Any]) -> None:
    httpx.post(f"{url}/admin/scheduler", json={"knobs": knobs}, timeout=30).raise_for_status()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", action="store_true")
    p.add_argument("--targets", default=CPU_TARGET, help="simulated: 'cpu' and hardware profile names")
    p.add_argument("--workloads", default="code-editing,chat")
    p.add_argument("--configs", default=CONFIGS)
    p.add_argument("--levels", default="0.3,0.7,1", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--duration-s", type=float, default=300.0, help="seconds of arrivals per run")
    p.add_argument("--drain-s", type=float, default=120.0)
    p.add_argument("--runs", type=int, default=3, help="live: alternating rounds (their median counts)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--capacity-rps", type=float, help="live: skip the capacity search and use this")
    p.add_argument("--adaptive-capacity", action="store_true", help="live: also search adaptive's capacity")
    p.add_argument("--start-qps", type=float, default=0.5)
    p.add_argument("--max-probes", type=int, default=4)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--model", help="live: the daemon's --model (default: the bundled one)")
    p.add_argument("--daemon-args", default="")
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.daemon_args = args.daemon_args.split() + (["--model", args.model] if args.model else [])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    workloads = args.workloads.split(",")
    if args.simulate:
        series = [simulated_series(t, w, args) for t in args.targets.split(",") for w in workloads]
    else:
        series = [live_series(args, w) for w in workloads]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta(), "series": series}, indent=1) + "\n")
    print(markdown(series))


def medians(series: dict[str, Any]) -> dict[tuple[float, str], float]:
    by: dict[tuple[float, str], list[float]] = {}
    for r in series["runs"]:
        by.setdefault((r["level"], r["config"]), []).append(r["goodput_rps"])
    return {key: statistics.median(values) for key, values in by.items()}


def markdown(series: list[dict[str, Any]]) -> str:
    lines = []
    for s in series:
        med = medians(s)
        configs = list(dict.fromkeys(r["config"] for r in s["runs"]))
        adaptive = next((c for c in configs if c.startswith("adaptive")), None)
        head = " | ".join(configs)
        lines += [f"**{s['target']}, {s['workload']}**: capacity without speculation {s['capacity_rps']:.3g} req/s"
                  + (f", with {adaptive} {s['adaptive_capacity_rps']:.3g} req/s "
                     f"({s['adaptive_capacity_rps'] / s['capacity_rps']:.2f}x)" if s.get("adaptive_capacity_rps") else ""),
                  "", f"| load | {head} | {adaptive} / best other |", "|---|" + "---:|" * (len(configs) + 1)]
        for level in sorted({r["level"] for r in s["runs"]}):
            values = [med[(level, c)] for c in configs]
            others = [med[(level, c)] for c in configs if c != adaptive]
            ratio = f"{med[(level, adaptive)] / max(others):.2f}" if adaptive and max(others) > 0 else "-"
            lines.append(f"| {level:g}x | " + " | ".join(f"{v:.3f}" for v in values) + f" | {ratio} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_doc(sources: list[Path]) -> str:
    return "\n".join(markdown(json.loads(Path(p).read_text())["series"]) for p in sources)


if __name__ == "__main__":
    main()
