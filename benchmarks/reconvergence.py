"""Re-convergence after each workload shift, from a tuning run's decision log.

`autotuned-serve tune --simulate --state-dir DIR` leaves the controller's decisions in
DIR/decisions.jsonl (one line per decision; `t` is simulated seconds from the run's start). Given
the workload and --duration of that run, this finds each phase change and reports, per phase:

- detected_s: from the phase change to the controller's `drift` (or first `regime`) decision;
- slo_met_s: from the phase change to the end of the first measured window that met the SLO and
  after which every measured window of the phase met it (None: the phase ended on a violating
  window); windows are attributed to the phase they end in, and the first window that ends after
  the change mostly measured the previous phase;
- settled_s: from the phase change to the end of the first window that ran the configuration the
  controller was running at the phase's end (its last re-check, else its last measured window):
  when it first tried the configuration it settled on;
- windows / violating: the controller's measured windows ending in the phase, and how many broke
  the SLO; the final knobs.

    python benchmarks/reconvergence.py --state-dir out/tune_h100 --workload sharegpt4-arxiv-shift --duration 900
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadgen.workload import load_workload

TUNED_KNOBS = ("token_budget", "step_headroom", "error_budget", "prefill_priority", "max_num_seqs",
               "kv_admission_watermark")


def phase_bounds(workload: str, duration_s: float) -> list[tuple[str, float, float]]:
    """(name, start, end) of each phase of a run generated with --duration (share phases only)."""
    phases = load_workload(workload).phases
    if any(p.requests is not None for p in phases):
        raise ValueError(f"{workload}: phases with a fixed request count have no fixed length")
    total = sum(p.weight for p in phases)
    bounds, start = [], 0.0
    for p in phases:
        end = start + duration_s * p.weight / total
        bounds.append((p.name, start, end))
        start = end
    return bounds


def read_decisions(state_dir: str) -> list[dict[str, Any]]:
    path = Path(state_dir) / "decisions.jsonl"
    if not path.exists():
        raise ValueError(f"no decisions.jsonl in {state_dir}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tuned(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in knobs.items() if k in TUNED_KNOBS}


def phase_report(name: str, start: float, end: float, decisions: list[dict[str, Any]]) -> dict[str, Any]:
    inside = [d for d in decisions if start < d["t"] <= end]
    measured = [d for d in inside if d.get("violated") is not None]
    detected = next((d["t"] - start for d in inside if d["action"] in ("drift", "regime")), None)
    last_bad = max((i for i, d in enumerate(measured) if d["violated"]), default=-1)
    slo_met = measured[last_bad + 1]["t"] - start if last_bad + 1 < len(measured) else None
    rechecks = [d for d in measured if d["action"] == "recheck"]
    final = (rechecks or measured or [None])[-1]
    settled = None
    if final is not None:
        settled = next(d["t"] - start for d in measured if tuned(d["knobs"]) == tuned(final["knobs"]))
    return {"phase": name, "start_s": round(start, 1), "end_s": round(end, 1),
            "detected_s": None if detected is None else round(detected, 1),
            "slo_met_s": None if slo_met is None else round(slo_met, 1),
            "settled_s": None if settled is None else round(settled, 1),
            "windows": len(measured), "violating": sum(bool(d["violated"]) for d in measured),
            "exploring_violating": sum(bool(d["violated"]) for d in measured if d["action"] in ("trial", "abort")),
            "final_knobs": tuned(final["knobs"]) if final else None,
            "final_from": final["action"] if final else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", required=True, help="the --state-dir of the tune --simulate run")
    p.add_argument("--workload", required=True, help="the run's --workload")
    p.add_argument("--duration", type=float, required=True, help="the run's --duration")
    args = p.parse_args()
    decisions = read_decisions(args.state_dir)
    phases = [phase_report(name, start, end, decisions)
              for name, start, end in phase_bounds(args.workload, args.duration)]
    for row in phases:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
