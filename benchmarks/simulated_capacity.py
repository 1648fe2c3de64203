"""Capacity under the SLO on the simulator: Sarathi-Serve's bracketed binary search per policy and
token budget, each probe one seeded open-loop run of the workload through the calibrated cost model.

The same search as `autotuned-serve capacity` (loadgen/capacity.py) with the simulator as the
server, so a whole table takes seconds; what it predicts is only as good as the cost model
(docs/simulator.md, docs/design/cost_models.md).

    python benchmarks/simulated_capacity.py
    python benchmarks/simulated_capacity.py --policies sarathi --budgets 32 64 --requests 400 --slo-tbt-s 0.5
    python benchmarks/simulated_capacity.py --policies sarathi deadline --budgets 32 2048 --knob step_headroom=1.0
    python benchmarks/simulated_capacity.py --policies deadline sarathi --budgets 64 2048 --scatter 0.3

--scatter SIGMA draws each step's time around the model's prediction with the live daemon's scatter
(simulation/step_scatter.py: lognormal, median 1; the live daemon's is `scatter_sigma` in the cost model
of `autotuned-serve tuner status`), the deadline policy pricing at its 90th percentile as live.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import results_file
from loadgen.capacity import CapacityCriteria, search_capacity
from serving.cli_tuning import parse_knobs
from simulation.cost_model_files import resolve_cost_model
from simulation.step_scatter import lognormal_scatter
from simulation.workload_run import simulated_probe
from loadgen.workload import load_workload
from simulation.profile_cost_model import StepTimeModel
from policies import Knobs
from engine.slo_class import SloClass


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="chat", help="a preset in configs/workloads.yaml (default chat)")
    p.add_argument("--policies", nargs="+", default=["sarathi", "adaptive", "prefill-first", "orca"])
    p.add_argument("--budgets", type=int, nargs="+", default=[32, 64, 128, 256])
    p.add_argument("--requests", type=int, default=400, help="requests per probe (default 400)")
    p.add_argument("--min-duration-s", type=float, default=0.0,
                   help="more requests where --requests would arrive within this many seconds (default 0)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0, help="P50 TTFT bound (default 2.0)")
    p.add_argument("--slo-tbt-s", type=float, default=0.25, help="P99 TBT bound (default 0.25)")
    p.add_argument("--max-probes", type=int, default=10)
    p.add_argument("--cost-model", default=None, help="default: the shipped calibration")
    p.add_argument("--profile", default=None, help="a hardware profile instead (autotuned-serve profiles)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scatter", type=float, default=0.0, metavar="SIGMA",
                   help="log-spread of step times around the model (default 0: exactly as predicted)")
    p.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                   help="another knob for every run (repeatable; a policy reads only its own)")
    p.add_argument("--json", default=None, help="also write the results, with their meta, to this file")
    return p.parse_args()


def capacity(cost: StepTimeModel, policy: str, budget: int, args: argparse.Namespace) -> dict:
    workload = load_workload(args.workload)
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    knobs = Knobs(token_budget=budget, **parse_knobs(args.knob))
    probe = simulated_probe(workload, cost, policy, knobs, slo, args.requests, args.seed, args.min_duration_s)
    result = search_capacity(probe, CapacityCriteria(args.slo_ttft_s, args.slo_tbt_s), start_qps=0.25,
                             max_probes=args.max_probes, tolerance=0.05)
    return {"policy": policy, "token_budget": budget, "capacity_qps": result.capacity_qps,
            "first_failing_qps": result.first_failing_qps, "probes": len(result.probes)}


def main() -> None:
    args = parse_args()
    if not 0.0 <= args.scatter <= 1.0:
        raise SystemExit(f"--scatter must be in [0, 1], got {args.scatter}")
    cost = replace(resolve_cost_model(args.cost_model, args.profile), step_scatter=lognormal_scatter(args.scatter))
    rows = [capacity(cost, policy, budget, args) for policy in args.policies for budget in args.budgets]
    print(f"{'policy':<16}{'budget':>8}{'capacity qps':>14}{'first failing':>15}")
    for r in rows:
        failing = "-" if r["first_failing_qps"] is None else f"{r['first_failing_qps']:.3f}"
        print(f"{r['policy']:<16}{r['token_budget']:>8}{r['capacity_qps']:>14.3f}{failing:>15}")
    results = {"workload": args.workload, "slo": {"ttft_p50_s": args.slo_ttft_s, "tbt_p99_s": args.slo_tbt_s},
               "cost_model": args.profile or cost.model, "knobs": parse_knobs(args.knob), "scatter_sigma": args.scatter,
               "requests": args.requests, "min_duration_s": args.min_duration_s, "results": rows}
    print(json.dumps(results, indent=2))
    if args.json:
        results_file.write(args.json, results)


def render_doc(sources: list[Path]) -> str:
    """docs/simulator.md's capacity table (benchmarks/render_docs.py): a results file holding this
    script's JSON output, one row per token budget, one column per policy."""
    r = json.loads(Path(sources[0]).read_text())
    policies = list(dict.fromkeys(row["policy"] for row in r["results"]))
    budgets = list(dict.fromkeys(row["token_budget"] for row in r["results"]))
    cap = {(row["policy"], row["token_budget"]): row["capacity_qps"] for row in r["results"]}
    best = max(cap.values())
    lines = ["| token budget | " + " | ".join(policies) + " |", "| --- |" + " --- |" * len(policies)]
    for b in budgets:
        cells = [f"**{cap[p, b]:.3f}**" if cap[p, b] == best and p == policies[0] else f"{cap[p, b]:.3f}"
                 for p in policies]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + (f"\n\n(requests/s, {r['workload']}, P50 TTFT <= {r['slo']['ttft_p50_s']:g} s, "
                               f"P99 TBT <= {r['slo']['tbt_p99_s']:g} s.)")


def render_speed(sources: list[Path]) -> str:
    """docs/simulator.md's speed line: a results file holding `autotuned-serve simulate`'s JSON output."""
    r = json.loads(Path(sources[0]).read_text())
    m = r["meta"]["machine"]
    return (f"{r['num_requests']:,} requests, {r['num_steps']:,} steps: **{r['wall_s']:.1f} s** of wall time "
            f"({1e6 * r['wall_s'] / r['num_steps']:.0f} us a step) on {m['cpu_model']}, {m['cores']} cores, "
            f"1-minute load average {r['load_avg_1m_before']:.1f} before the run.")


if __name__ == "__main__":
    main()
