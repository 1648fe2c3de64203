"""The simulator's speed on the GPU profiles (docs/design/hardware_profiles.md, "Simulation speed"): each run's
`autotuned-serve simulate` in its own process, its JSON's steps, requests, SLO attainment and `wall_s`
(the simulation and its summary; the process adds Python's start-up and the torch import).

    python benchmarks/profile_speed.py                                                    # print them
    python benchmarks/profile_speed.py --json docs/results/profile_simulation_speed.json  # and store them

benchmarks/render_docs.py renders the stored file (render_doc) into docs/design/hardware_profiles.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import results_file

# (what the run is, `autotuned-serve simulate`'s arguments)
RUNS = (
    ("H100 + Llama-3.1-8B, chat at 40 req/s, sarathi 2048",
     "--profile h100-llama3.1-8b --workload chat --qps 40 --requests 10000 --policy sarathi --knob token_budget=2048"),
    ("H100 + Llama-3.1-8B, chat at 40 req/s, deadline",
     "--profile h100-llama3.1-8b --workload chat --qps 40 --requests 10000 --policy deadline"),
    ("A100 + Mistral-7B, arxiv-summarization at 2.5 req/s, sarathi 512",
     "--profile a100-mistral-7b --workload arxiv-summarization --qps 2.5 --requests 10000 --policy sarathi "
     "--knob token_budget=512 --slo-tbt-s 0.1"),
    ("H100 + Llama-3.1-8B, diurnal compressed into one hour, deadline 2048",
     "--profile h100-llama3.1-8b --workload diurnal --qps 5.8 --duration 3600 --policy deadline "
     "--knob token_budget=2048"),
)


def simulate(label: str, arguments: str) -> dict[str, Any]:
    """One run in a fresh process (no state shared between runs), with the load average before it."""
    load_before = os.getloadavg()[0]
    argv = [sys.executable, "-m", "serving.cli", "simulate", *shlex.split(arguments)]
    out = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return {"run": label, "command": "autotuned-serve simulate " + arguments, "load_avg_1m_before": load_before,
            "num_requests": out["num_requests"], "num_steps": out["num_steps"],
            "slo_attainment": out["slo_attainment"], "wall_s": out["wall_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="also store the runs here (results_file, with meta)")
    args = p.parse_args()
    runs = [simulate(label, arguments) for label, arguments in RUNS]
    for r in runs:
        print(f"{r['run']}: {r['num_requests']} requests, {r['num_steps']} steps, {r['wall_s']:.1f} s")
    if args.json:
        results_file.write(args.json, {"runs": runs})


def render_doc(sources: list[Path]) -> str:
    """docs/design/hardware_profiles.md's speed table (benchmarks/render_docs.py), from the stored runs."""
    stored = results_file.read(sources[0])
    m = stored["meta"]
    lines = ["| run | requests | steps | wall_s |", "|---|---|---|---|"]
    for r in stored["runs"]:
        lines.append(f"| {r['run']} | {r['num_requests']:,} | {r['num_steps']:,} | **{r['wall_s']:.1f} s** |")
    loads = [r["load_avg_1m_before"] for r in stored["runs"]]
    commit = m["commit"][:7] + ("-dirty" if m["commit"].endswith("-dirty") else "")   # HEAD plus uncommitted changes
    return "\n".join(lines) + (f"\n\n(On {m['machine']['cpu_model']}, {m['machine']['cores']} cores, at {commit}; "
                               f"1-minute load average {min(loads):.1f}-{max(loads):.1f} before the runs.)")


if __name__ == "__main__":
    main()
