"""Which phases want different configurations? The search for shifts a tuner can win on.

For each workload (its phases served alone): the deadline policy's simulated capacity with its
default knobs, then a grid of static configurations over the tuner's knobs at `--load` x that rate.
For every pair of workloads, the per-phase ceiling of a shift between them (equal time in each, each
at its own rate): the goodput of the best configuration per phase over the best single one, the
number `tune --simulate` reports for a shift. A pair near 1.00x gives a tuner nothing to win over a
well-chosen constant; one from about 1.2x up is where switching can pay.

    python benchmarks/phase_grid.py --profile h100-llama3.1-8b
    python benchmarks/phase_grid.py --profile a100-mistral-7b --workloads sharegpt4 rag reasoning --requests 300
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.workload import generate, load_workload
from policies import Knobs
from simulation.cost_model_files import resolve_cost_model
from simulation.workload_run import simulate
from engine.slo_class import SloClass

# the tuner's knobs (configs/tuning.yaml), each at the ends of its range or near them
GRID = {"token_budget": (256, 2048), "step_headroom": (0.6, 0.9, 1.2), "error_budget": (0.0, 1.0),
        "max_num_seqs": (32, 256), "kv_admission_watermark": (0.01, 0.2)}
WORKLOADS = ("sharegpt4", "arxiv-summarization", "rag", "code-completion", "agentic", "reasoning")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="h100-llama3.1-8b", help="hardware profile (default h100-llama3.1-8b)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    p.add_argument("--requests", type=int, default=400, help="requests per run (default 400)")
    p.add_argument("--load", type=float, default=0.9, help="grid runs at this share of the capacity (default 0.9)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0, help="P50 TTFT bound (default 2.0)")
    p.add_argument("--slo-tbt-s", type=float, default=0.1, help="P99 TBT bound (default 0.1, Sarathi-Serve's strict)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def grid_points() -> list[dict[str, Any]]:
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def phase_goodputs(workload: str, cost, slo: SloClass, args: argparse.Namespace) -> dict[str, Any]:
    """The workload's capacity with default knobs, and each grid point's goodput at load x it."""
    spec = load_workload(workload)

    def run(qps: float, knobs: Knobs):
        return simulate(generate(spec, qps=qps, num_requests=args.requests, seed=args.seed), cost, "deadline",
                        knobs, slo).summary

    found = search_capacity(lambda qps: run(qps, Knobs()), CapacityCriteria(slo.ttft_s, slo.tbt_s),
                            start_qps=1.0, max_probes=10, tolerance=0.05)
    qps = args.load * found.capacity_qps
    goodputs = [run(qps, Knobs().replace(**point)).goodput_rps for point in grid_points()]
    return {"capacity_qps": found.capacity_qps, "qps": qps, "goodput_rps": goodputs}


def best_point(points: list[dict[str, Any]], goodputs: list[float]) -> dict[str, Any]:
    return points[max(range(len(points)), key=goodputs.__getitem__)]


def pair_ceiling(a: list[float], b: list[float]) -> tuple[float, int]:
    """Per-phase best over the best single configuration for an equal-time shift between a and b."""
    both = [x + y for x, y in zip(a, b)]
    best = max(range(len(both)), key=both.__getitem__)
    return (max(a) + max(b)) / both[best] if both[best] > 0 else float("inf"), best


def main() -> None:
    args = parse_args()
    cost = resolve_cost_model(None, args.profile, None)
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    points = grid_points()
    start = time.perf_counter()
    phases = {w: phase_goodputs(w, cost, slo, args) for w in args.workloads}
    pairs = []
    for a, b in itertools.combinations(args.workloads, 2):
        ceiling, best = pair_ceiling(phases[a]["goodput_rps"], phases[b]["goodput_rps"])
        pairs.append({"shift": f"{a} <-> {b}", "per_phase_ceiling": round(ceiling, 4), "best_single": points[best],
                      f"best_for_{a}": best_point(points, phases[a]["goodput_rps"]),
                      f"best_for_{b}": best_point(points, phases[b]["goodput_rps"])})
    pairs.sort(key=lambda p: -p["per_phase_ceiling"])
    summary = {w: {"capacity_qps": round(p["capacity_qps"], 3), "grid_qps": round(p["qps"], 3),
                   "best_goodput_rps": round(max(p["goodput_rps"]), 3),
                   "worst_goodput_rps": round(min(p["goodput_rps"]), 3),
                   "best": best_point(points, p["goodput_rps"])}
               for w, p in phases.items()}
    print(json.dumps({"profile": args.profile, "slo": {"ttft_p50_s": slo.ttft_s, "tbt_p99_s": slo.tbt_s},
                      "load": args.load, "requests": args.requests, "grid": GRID, "phases": summary,
                      "pairs": pairs, "wall_s": round(time.perf_counter() - start, 1)}, indent=2))


if __name__ == "__main__":
    main()
