"""Step times under torch's OpenMP wait policies, side by side: the engine's PASSIVE (threads sleep
after each op) against ACTIVE (they spin; with nothing set, libgomp spins for a bounded count).

On the CPU the engine alternates torch's ops (norms, activation, RoPE, sampling, the dense GEMM)
with its own kernels (engine/kernels/csrc/), which run on a pool of their own: spinning OpenMP threads then
hold the cores that pool needs, and the reverse. libgomp reads the policy once, when torch loads, so
each policy runs benchmarks/step_time.py in a process of its own; the policies alternate for
--rounds rounds and each step's figure is the median over rounds of step_time's medians.

    python benchmarks/omp_wait_policy.py
    python benchmarks/omp_wait_policy.py --rounds 1 --batch-sizes 1 8 --steps 5 --prefill-requests 2
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from bench_common import MachineInfo, emit_summary

POLICIES = ("ACTIVE", "PASSIVE")
STEP_TIME = pathlib.Path(__file__).resolve().parent / "step_time.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="runs of step_time.py per policy, alternating (default 2)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--steps", type=int, default=10, help="timed decode steps per batch size (default 10)")
    p.add_argument("--prefill-requests", type=int, default=3, help="step_time's --prefill-requests (default 3)")
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    return p.parse_args()


def run_step_time(policy: str, args: argparse.Namespace) -> dict[str, float]:
    """step_time.py under `policy`: median wall seconds per step label ('decode 8', 'prefill 512 ctx 0')."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "steps.json"
        cmd = [sys.executable, str(STEP_TIME), "--batch-sizes", *map(str, args.batch_sizes), "--steps",
               str(args.steps), "--prefill-requests", str(args.prefill_requests), "--json", str(out)]
        subprocess.run(cmd, env={**os.environ, "OMP_WAIT_POLICY": policy}, check=True, stdout=subprocess.DEVNULL)
        results = json.loads(out.read_text())["results"]
    return {label(r): r["wall_s"] for r in results}


def label(result: dict) -> str:
    if result["kind"] == "decode":
        return f"decode {result['batch']}"
    return f"prefill {result['batch']} ctx {result['context']}"


def main() -> None:
    args = parse_args()
    runs: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for policy in POLICIES if r % 2 == 0 else reversed(POLICIES):
            print(f"round {r + 1}: {policy}", flush=True)
            runs[policy].append(run_step_time(policy, args))
    steps = list(runs[POLICIES[0]][0])
    table = {s: {p: statistics.median(run[s] for run in runs[p]) for p in POLICIES} for s in steps}
    print(f"\n{'step':<22}{'ACTIVE ms':>11}{'PASSIVE ms':>12}{'PASSIVE/ACTIVE':>16}")
    for step, t in table.items():
        print(f"{step:<22}{1e3 * t['ACTIVE']:>11.1f}{1e3 * t['PASSIVE']:>12.1f}{t['PASSIVE'] / t['ACTIVE']:>16.2f}")
    emit_summary({"machine": MachineInfo.collect().as_dict(), "rounds": args.rounds,
                  "median_wall_s": table, "runs": runs}, args.json)


if __name__ == "__main__":
    main()
