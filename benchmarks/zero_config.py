"""The zero-config matrix: does the tuner spare the operator the hand-tuning, on every machine,
workload and start? In the simulator, per hardware (this CPU's calibration, GPU profiles) and
workload, at a share (--load) of the modelled machine's sustained capacity:

- the best static configuration of the deadline policy's grid, run over the same requests;
- per start (the daemon's defaults and configurations an operator might wrongly pick), the tuned
  run from that start (`tune --simulate`'s controller, shipped configs/tuning.yaml) and the start
  left alone (static);
- convergence_s: the first 30-s boundary T from which, in every 120-s window (sliding by 30 s) to
  the end, tuned serves >= 0.95x the best static's good requests, requests counted by arrival so
  both runs are judged on the same requests;
- after convergence: tuned / best static goodput over [T, end], and the share of 30-s bins (by
  finish time) whose P50 TTFT or P99 TBT missed the SLO, tuned's and the best static's own; once
  over every request finishing from T, and once over the requests that arrived from T (`_new_arrivals`):
  the first bin after T also holds requests admitted under the configuration tuned moved away from;
- wrong_start_loss: best static goodput / the start's own static goodput (what not tuning costs).

A run lasts --duration simulated seconds, or until --min-requests arrived where that is longer (the
CPU's summarization: ~0.07 req/s), and goodput is compared over 120-s windows or windows of 100
arrivals where those are longer.

Each (hardware, workload) pair appends one JSON line to --out as it finishes, so a run can be split
over processes and resumed (pairs already in the file are skipped).

    python benchmarks/zero_config.py --hardware cpu --out docs/results/zero_config.jsonl
    python benchmarks/zero_config.py --hardware h100-llama3.1-8b --workloads chat shift --out ...
    python benchmarks/zero_config.py --hardware cpu --workloads summarization --grid-floor --out ...
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autotuner.controller import ControllerSettings
from autotuner.search_space import load_search_space
from autotuner.simulated_tuning import (BIN_S, best_of, evaluate_static, static_grid, tune_on_simulator,
                                        violating_bin_fraction)
from autotuner.static_grid import grid_points
import results_file
from engine.outputs import RequestRecord
from loadgen.workload import RequestSpec, generate, load_workload
from policies import Knobs
from serving.settings import Settings
from simulation.cost_model_files import resolve_cost_model
from simulation.profile_cost_model import StepTimeModel
from simulation.relative_load import simulated_capacity
from simulation.workload_run import simulate
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass
from telemetry.window import meets_slo

ROOT = Path(__file__).resolve().parent.parent
CPU_CALIBRATIONS = {"avx512": "configs/cost_models/smollm2-135m-instruct-fp32-quantized-cpu-avx512-bf16.json",
                    "avx2": "configs/cost_models/smollm2-135m-instruct-fp32-quantized-cpu.json"}
PROFILES = ("h100-llama3.1-8b", "a100-mistral-7b", "h100-llama3.1-70b-tp4", "h100-llama3.1-70b-tp8")
WORKLOADS = ("chat", "summarization", "mixed-classes", "chat-system-prompt", "multi-turn", "shift", "diurnal")
# what an operator might pick by hand, each wrong somewhere: tiny steps, huge prefill-first steps,
# deadline steps sized to half the TBT slack
WRONG_STARTS = {"sarathi-32": ("sarathi", {"token_budget": 32}),
                "prefill-first-8192": ("prefill-first", {"token_budget": 8192}),
                "deadline-headroom-0.5": ("deadline", {"token_budget": 2048, "step_headroom": 0.5})}
# a summarization prompt (1,000-4,000 tokens; sharegpt4's in diurnal; shift's middle phase) takes seconds to
# prefill alone on the 2-core CPU: no rate meets a 2 s TTFT there, so those cells on the CPU run at a 10 s TTFT
# bound (shift's from stop 50, when each phase began to set the capacity: at 2 s its summarization phase
# meets the SLO at no rate)
CPU_TTFT_S = {"summarization": 10.0, "diurnal": 10.0, "shift": 10.0}
CONVERGED = 0.95          # tuned goodput over the rest of the run, as a share of the best static's
RATE_WINDOW_S = 120.0     # goodput is compared over windows this long (~150 requests on the CPU's chat) ...
WINDOW_REQUESTS = 100     # ... or holding this many arrivals, where that is longer


@dataclass(frozen=True)
class Start:
    name: str
    policy: str
    knobs: Knobs


def starts() -> list[Start]:
    """The daemon's defaults (serving/settings.py), then the wrong starts."""
    defaults = Settings()
    out = [Start("defaults", defaults.policy, defaults.knob_values())]
    return out + [Start(name, policy, Knobs().replace(**knobs)) for name, (policy, knobs) in WRONG_STARTS.items()]


def cpu_calibration() -> str:
    """The shipped calibration of the kernels this CPU runs (AVX-512 VNNI, else AVX2)."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return str(ROOT / CPU_CALIBRATIONS["avx512" if "avx512_vnni" in flags else "avx2"])


def cost_model(hardware: str) -> StepTimeModel:
    if hardware == "cpu":
        return resolve_cost_model(cpu_calibration())
    return resolve_cost_model(profile=hardware)


def good_by_arrival(specs: list[RequestSpec], records: list[RequestRecord], slo: SloClass, bin_s: float) -> np.ndarray:
    """Requests that met the SLO, per `bin_s` bin of their arrival time (simulator ids: sim-<index>)."""
    arrivals = sorted(s.arrival_s for s in specs)
    counts = np.zeros(int(arrivals[-1] // bin_s) + 1)
    for r in records:
        if meets_slo(r, slo):
            counts[int(arrivals[int(r.request_id.removeprefix("sim-"))] // bin_s)] += 1
    return counts


def arrived_from(records: list[RequestRecord], start_s: float) -> list[RequestRecord]:
    """The records of requests that arrived at or after `start_s` (the simulator's clock is the specs')."""
    return [r for r in records if r.arrival >= start_s]


def rate_window_s(qps: float) -> float:
    """Goodput is compared over windows of RATE_WINDOW_S, or of WINDOW_REQUESTS arrivals at low rates."""
    return max(RATE_WINDOW_S, WINDOW_REQUESTS / qps)


def convergence_bin(tuned: np.ndarray, static: np.ndarray, bin_s: float, window_s: float) -> int | None:
    """The first bin from which every `window_s` window (sliding by one bin, within the run) has
    tuned serving >= CONVERGED x the static run's good requests; None if there is none."""
    width = max(1, int(window_s // bin_s))
    starts = range(len(tuned) - width + 1)
    ok = [tuned[i:i + width].sum() >= CONVERGED * static[i:i + width].sum() for i in starts]
    return next((first for first in starts if all(ok[first:])), None)


def run_cell(specs: list[RequestSpec], cost: StepTimeModel, slo: SloClass, start: Start,
             static_records: list[RequestRecord], static_good: np.ndarray, static_goodput: float, window_s: float,
             seed: int) -> dict[str, Any]:
    """One start: tuned from it, and left alone."""
    with tempfile.TemporaryDirectory() as state:
        t0 = time.perf_counter()
        controller, records, end = tune_on_simulator(specs, cost, state, slo, ControllerSettings.load(),
                                                     load_search_space(max_token_budget=None), seed,
                                                     initial=start.knobs, initial_policy=start.policy)
        wall = time.perf_counter() - t0
    tuned = summarize_requests(records, slo, end - specs[0].arrival_s)
    alone = evaluate_static(specs, cost, start.policy, start.knobs, slo)
    good = good_by_arrival(specs, records, slo, BIN_S)
    first = convergence_bin(good, static_good, BIN_S, window_s)
    cell = {"start": start.name, "tuned_goodput_rps": tuned.goodput_rps, "tuned_over_best_static":
            tuned.goodput_rps / static_goodput if static_goodput else None,
            "left_alone_goodput_rps": alone.goodput_rps,
            "wrong_start_loss": static_goodput / alone.goodput_rps if alone.goodput_rps else float("inf"),
            "convergence_s": None, "after_convergence_over_best_static": None,
            "violating_bins_after_convergence": None, "tuning_windows": controller.windows,
            "warm_start_failures": controller.failures.count("warm_start"),
            "wall_s": round(wall, 1)}
    if first is not None:
        t = first * BIN_S
        cell |= {"convergence_s": t, "after_convergence_over_best_static": good[first:].sum() / static_good[first:].sum()
                 if static_good[first:].sum() else None,
                 "violating_bins_after_convergence": violating_bin_fraction(records, slo, BIN_S, t),
                 # what the best static configuration itself violates over the same bins
                 "best_static_violating_bins_after_convergence":
                     violating_bin_fraction(static_records, slo, BIN_S, t),
                 "violating_bins_after_convergence_new_arrivals":
                     violating_bin_fraction(arrived_from(records, t), slo, BIN_S, t),
                 "best_static_violating_bins_after_convergence_new_arrivals":
                     violating_bin_fraction(arrived_from(static_records, t), slo, BIN_S, t)}
    return cell


def run_pair(hardware: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    cost = cost_model(hardware)
    wl = load_workload(workload)
    if hardware == "cpu":
        slo = SloClass(ttft_s=CPU_TTFT_S.get(workload, args.slo_ttft_s), tbt_s=args.slo_tbt_s)
    else:
        slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.gpu_slo_tbt_s)
    capacity = simulated_capacity(wl, cost, slo, args.seed)
    qps = args.load * capacity
    duration = max(args.duration, args.min_requests / qps)      # a low rate needs longer to say anything
    specs = generate(wl, qps=qps, duration_s=duration, seed=args.seed)
    grid = static_grid(specs, cost, load_search_space(max_token_budget=None), "deadline", slo)
    best_params, best = best_of(grid)
    static_records = simulate(specs, cost, "deadline", Knobs().replace(**best_params), slo).records
    static_good = good_by_arrival(specs, static_records, slo, BIN_S)
    cells = [run_cell(specs, cost, slo, s, static_records, static_good, best.goodput_rps, rate_window_s(qps),
                      args.seed) for s in starts()]
    return {"hardware": hardware, "workload": workload, "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
            "capacity_qps": capacity, "load": args.load, "qps": qps, "num_requests": len(specs),
            "duration_s": duration, "rate_window_s": rate_window_s(qps), "best_static_knobs": best_params,
            "best_static_goodput_rps": best.goodput_rps, "best_static_slo_attainment": best.slo_attainment,
            "cells": cells}


def grid_floor(hardware: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each configuration of the static grid judged as if it were a tuned run, against the best
    one: what the convergence criterion makes of a configuration held from the first second. Where
    the grid's near-best configurations (within 2% of the best's goodput) themselves "converge"
    late or never, a tuned cell holding one of them misses the bars on the criterion's noise (100
    arrivals a window at low rates: +-4% between configurations on the same requests), not on
    what it serves."""
    cost, wl = cost_model(hardware), load_workload(workload)
    slo = SloClass(ttft_s=CPU_TTFT_S.get(workload, args.slo_ttft_s), tbt_s=args.slo_tbt_s) if hardware == "cpu" else \
        SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.gpu_slo_tbt_s)
    qps = args.load * simulated_capacity(wl, cost, slo, args.seed)
    specs = generate(wl, qps=qps, duration_s=max(args.duration, args.min_requests / qps), seed=args.seed)
    space = load_search_space(max_token_budget=None)
    runs = [(params, simulate(specs, cost, "deadline", Knobs().replace(**params), slo))
            for params in (point | space.clamp(Knobs().as_dict() | point) for point in grid_points("deadline"))]
    _, best = max(runs, key=lambda run: run[1].summary.goodput_rps)
    best_good = good_by_arrival(specs, best.records, slo, BIN_S)
    rows = []
    for params, run in runs:
        good = good_by_arrival(specs, run.records, slo, BIN_S)
        first = convergence_bin(good, best_good, BIN_S, rate_window_s(qps))
        rows.append({"knobs": {k: params[k] for k in ("token_budget", "step_headroom", "error_budget")},
                     "over_best_static": run.summary.goodput_rps / best.summary.goodput_rps,
                     "convergence_s": None if first is None else first * BIN_S,
                     "after_convergence_over_best_static": None if first is None else
                     good[first:].sum() / best_good[first:].sum()})
    return {"hardware": hardware, "workload": workload, "qps": qps, "grid_floor": rows}


def provenance() -> dict[str, dict]:
    """Which machine, commit and command produced a result (each line is appended on its own)."""
    return {"meta": results_file.meta()}


def done_pairs(out: Path) -> set[tuple[str, str]]:
    if not out.exists():
        return set()
    return {(r["hardware"], r["workload"]) for r in map(json.loads, out.read_text().splitlines()) if "cells" in r}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hardware", nargs="+", default=["cpu", *PROFILES],
                   help="cpu (this machine's shipped calibration) and/or hardware profile names")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    p.add_argument("--duration", type=float, default=900.0, help="simulated seconds of arrivals (default 900)")
    p.add_argument("--min-requests", type=int, default=600,
                   help="at low rates the run lasts until this many requests arrived (default 600)")
    p.add_argument("--load", type=float, default=0.6, help="share of the sustained simulated capacity (default 0.6: "
                   "at 0.8 the best static configuration serves only ~80%% of the CPU's chat requests within the SLO)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25, help="TBT SLO on the CPU (default 0.25)")
    p.add_argument("--gpu-slo-tbt-s", type=float, default=0.1, help="TBT SLO on GPU profiles (default 0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON lines, one per (hardware, workload); appended")
    p.add_argument("--grid-floor", action="store_true", help="instead of the cells: each static grid configuration "
                   "judged by the convergence criterion against the best one (what holding it from the start scores)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_pairs(out)
    for hardware in args.hardware:
        for workload in args.workloads:
            if args.grid_floor:
                with out.open("a") as f:
                    f.write(json.dumps(grid_floor(hardware, workload, args) | provenance()) + "\n")
                continue
            if (hardware, workload) in done:
                continue
            t0 = time.perf_counter()
            result = run_pair(hardware, workload, args) | provenance() | {"wall_s":
                                                           round(time.perf_counter() - t0, 1)}
            with out.open("a") as f:
                f.write(json.dumps(result, default=str) + "\n")
            print(json.dumps({k: result[k] for k in ("hardware", "workload", "qps", "wall_s")} |
                             {c["start"]: (round(c["tuned_over_best_static"] or 0, 3), c["convergence_s"],
                                           round(c["wrong_start_loss"], 2)) for c in result["cells"]}), flush=True)


if __name__ == "__main__":
    main()
