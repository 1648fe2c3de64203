"""Goodput per SLO class on the simulator: the deadline-aware steps against the best single static
configuration of the plain-budget policies, on a workload that mixes classes (`mixed-classes`:
interactive chat, 2 s / 0.25 s, with batch summarization, 30 s / 2 s).

Each request is judged by its own class's targets (TTFT, and the P99 of its own token gaps). The
static grid is every (policy, token budget) pair given; "best static" is the pair with the most
total goodput at that load, chosen in hindsight. A window (by arrival time) meets the interactive
SLO when its interactive requests' P50 TTFT and P99 TBT over all their gaps are within the class's
targets, as the tuner's telemetry window judges it.

    python benchmarks/mixed_classes.py
    python benchmarks/mixed_classes.py --loads 1.0 1.5 --duration-s 3600 --json out.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from serving.cli_tuning import parse_knobs
from simulation.cost_model_files import find_cost_model
from simulation.workload_run import simulate
from loadgen.workload import generate, load_workload
from simulation.cost_model import CostModel
from engine.outputs import RequestRecord
from engine.slo_class import shipped_slo_classes
from policies import Knobs


@dataclass(frozen=True)
class Config:
    policy: str
    knobs: Knobs

    def label(self) -> str:
        return f"{self.policy}-{self.knobs.token_budget}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="mixed-classes")
    p.add_argument("--loads", type=float, nargs="+", default=[1.0, 1.25, 1.5],
                   help="--qps of the workload (for mixed-classes a load multiplier; default 1.0 1.25 1.5)")
    p.add_argument("--duration-s", type=float, default=3600.0)
    p.add_argument("--window-s", type=float, default=60.0)
    p.add_argument("--policies", nargs="+", default=["sarathi", "adaptive"], help="the static grid's policies")
    p.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128, 256, 512, 2048])
    p.add_argument("--deadline-budget", type=int, default=2048, help="the deadline policy's token cap")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="another deadline knob")
    p.add_argument("--cost-model", default=None, help="default: the shipped calibration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args()


def windows_meeting(records: list[RequestRecord], slo_class: str, window_s: float) -> tuple[int, int]:
    """(windows whose `slo_class` requests met its targets in aggregate, windows with any)."""
    target = shipped_slo_classes().get(slo_class)
    by_window: dict[int, list[RequestRecord]] = {}
    for r in records:
        if r.slo_class == slo_class:
            by_window.setdefault(int(r.arrival // window_s), []).append(r)
    met = 0
    for rs in by_window.values():
        ttft = [r.ttft_s for r in rs if r.ttft_s is not None]
        gaps = [g for r in rs for g in r.tbt_s]
        finished = all(r.finish_reason in ("stop", "length") for r in rs)
        met += (finished and bool(ttft) and float(np.median(ttft)) <= target.ttft_s
                and (not gaps or float(np.percentile(gaps, 99)) <= target.tbt_s))
    return met, len(by_window)


def run(specs, cost: CostModel, config: Config, window_s: float) -> dict:
    result = simulate(specs, cost, config.policy, config.knobs)
    s = result.summary
    classes = {name: {"goodput_rps": c["goodput_rps"], "slo_attainment": c["slo_attainment"]}
               for name, c in s.by_class.items()}
    met, windows = windows_meeting(result.records, "interactive", window_s)
    return {"config": config.label(), "goodput_rps": s.goodput_rps, "by_class": classes,
            "interactive_windows_met": met, "interactive_windows": windows}


def main() -> None:
    args = parse_args()
    cost = find_cost_model(args.cost_model)
    workload = load_workload(args.workload)
    deadline = Config("deadline", Knobs(token_budget=args.deadline_budget, **parse_knobs(args.knob)))
    grid = [Config(p, Knobs(token_budget=b)) for p in args.policies for b in args.budgets]
    rows = []
    for load in args.loads:
        specs = generate(workload, qps=load, duration_s=args.duration_s, seed=args.seed)
        ours = run(specs, cost, deadline, args.window_s)
        statics = [run(specs, cost, c, args.window_s) for c in grid]
        best = max(statics, key=lambda r: r["goodput_rps"])
        rows.append({"load": load, "requests": len(specs), "deadline": ours, "best_static": best,
                     "ratio": ours["goodput_rps"] / best["goodput_rps"] if best["goodput_rps"] else None,
                     "static_grid": statics})
        print_row(rows[-1])
    out = {"workload": args.workload, "cost_model": cost.model, "duration_s": args.duration_s,
           "window_s": args.window_s, "results": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def print_row(row: dict) -> None:
    def line(name: str, r: dict) -> str:
        classes = "  ".join(f"{c} {v['goodput_rps']:.4f} ({v['slo_attainment']:.0%})" for c, v in r["by_class"].items())
        return (f"  {name:<12}{r['config']:<16} total {r['goodput_rps']:.4f} req/s  {classes}  "
                f"interactive windows met {r['interactive_windows_met']}/{r['interactive_windows']}")
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
    print(f"load {row['load']} ({row['requests']} requests): deadline / best static = {ratio}")
    print(line("deadline", row["deadline"]))
    print(line("best static", row["best_static"]))


if __name__ == "__main__":
    main()
