"""The zero-config matrix: does the tuner spare the operator the hand-tuning, on every machine,
workload and start? In the simulator, per hardware (this CPU's calibration, GPU profiles) and
workload, at a share (--load) of the modelled machine's sustained capacity:

- the best static configuration of the deadline policy's grid, run over the same requests;
- per start (the daemon's defaults and configurations an operator might wrongly pick), the tuned
  run from that start (`tune --simulate`'s controller, shipped configs/tuning.yaml) and the start
  left alone (static);
- convergence_s: the first 30-s boundary T from which, in every window (one starting at each 30-s
  boundary, at least 120 s long and holding at least 100 arrivals) to the end, tuned serves >= 0.95x
  the best static's good requests, requests counted by arrival so both runs are judged on the same
  requests; and, for a start that held serves < 0.95x of the best static, not before the tuned run
  first left it (a window of a quiet hour can absorb the bins it still served);
- after convergence: tuned / best static goodput over [T, end], and the share of 30-s bins (by
  finish time) whose P50 TTFT or P99 TBT missed the SLO, tuned's and the best static's own; once
  over every request finishing from T, and once over the requests that arrived from T (`_new_arrivals`):
  the first bin after T also holds requests admitted under the configuration tuned moved away from;
- wrong_start_loss: best static goodput / the start's own static goodput (what not tuning costs).

A run lasts --duration simulated seconds, or until --min-requests arrived where that is longer (the
CPU's summarization: ~0.09 req/s). The CPU's long-prompt workloads run at the shipped batch class's
TTFT target (--long-prompt-ttft-s), and each row records the share of its requests that miss the SLO
even served alone on the idle machine (`missed_alone`).

Each (hardware, workload) pair appends one JSON line to --out as it finishes, so a run can be split
over processes and resumed (pairs already in the file are skipped).

    python benchmarks/zero_config.py --hardware cpu --out docs/results/zero_config.jsonl
    python benchmarks/zero_config.py --hardware h100-llama3.1-8b --workloads chat shift --out ...
    python benchmarks/zero_config.py --hardware cpu --workloads summarization --grid-floor --out ...
    python benchmarks/zero_config.py --speculation --workloads code-editing chat --out docs/results/zero_config_speculation.jsonl

--speculation: every run drafts as configs/speculation.yaml measured for the workload (prompt lookup);
the static grid (run at the daemon's setting: the priced choice of at most 8) adds the other
speculation settings (off, fixed 2/4/8, the priced choice of at most 16) on its best point, and the
starts add one verifying 8 drafts on every decode (`fixed-8`).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autotuner.controller import ControllerSettings
from autotuner.search_space import SHIPPED_KNOBS, load_search_space
from autotuner.simulated_tuning import (BIN_S, best_of, evaluate_static, grid_params, static_grid,
                                        tune_on_simulator, violating_bin_fraction)
from autotuner.targets import ConfigurationChange
import results_file
from engine.outputs import RequestRecord
from loadgen.workload import RequestSpec, generate, load_workload
from policies import Knobs
from serving.settings import Settings
from simulation.cost_model_files import resolve_cost_model
from simulation.profile_cost_model import StepTimeModel
from simulation.relative_load import simulated_capacity
from simulation.speculation_model import SpeculationModel, workload_speculation
from simulation.workload_run import simulate
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass, shipped_slo_classes
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
# with a drafter: every decode verifying 8 drafts whatever the load (vLLM's num_speculative_tokens)
SPECULATION_WRONG_STARTS = {"fixed-8": ("deadline", {"speculative_tokens": 8, "speculative_mode": "fixed"})}
# a summarization prompt (1,000-4,000 tokens; sharegpt4's in diurnal, up to 7,168; shift's middle phase) takes
# seconds to prefill alone on the 2-core CPU, so those cells on the CPU run at the TTFT target of the shipped
# `batch` class (configs/slo_classes.yaml: "summarization, offline jobs"; 30 s). At 10 s
# (--long-prompt-ttft-s 10) the best static configuration keeps ~81% of summarization's and diurnal's requests
# within the SLO at 0.6 of capacity and 15% of diurnal's miss it served alone, so no start can meet the bars.
# The TBT target stays the interactive one: their requests stream.
LONG_PROMPT_WORKLOADS = ("summarization", "diurnal", "shift")


def cpu_slo(workload: str, args: argparse.Namespace) -> SloClass:
    long_ttft_s = args.long_prompt_ttft_s or shipped_slo_classes().get("batch").ttft_s
    ttft_s = long_ttft_s if workload in LONG_PROMPT_WORKLOADS else args.slo_ttft_s
    return SloClass(ttft_s=ttft_s, tbt_s=args.slo_tbt_s)


def missed_alone(specs: list[RequestSpec], cost: StepTimeModel, slo: SloClass) -> float:
    """Share of the requests that miss the SLO served alone on the idle modelled machine (the
    daemon's defaults): what no configuration can serve, whatever the load."""
    starts_at_zero = [replace(s, arrival_s=0.0) for s in specs]
    return sum(not meets_slo(simulate([s], cost, "deadline", Knobs(), slo).records[0], slo)
               for s in starts_at_zero) / len(specs)


CONVERGED = 0.95          # tuned goodput over the rest of the run, as a share of the best static's
RATE_WINDOW_S = 120.0     # goodput is compared over windows this long (~150 requests on the CPU's chat) ...
WINDOW_REQUESTS = 100     # ... or holding this many arrivals, where that is longer


@dataclass(frozen=True)
class Start:
    name: str
    policy: str
    knobs: Knobs


def starts(speculation: bool = False) -> list[Start]:
    """The daemon's defaults (serving/settings.py), then the wrong starts, each the daemon's knobs but
    for what it names (with a drafter, one more)."""
    defaults = Settings()
    wrong = WRONG_STARTS | (SPECULATION_WRONG_STARTS if speculation else {})
    out = [Start("defaults", defaults.policy, defaults.knob_values())]
    return out + [Start(name, policy, defaults.knob_values().replace(**knobs)) for name, (policy, knobs) in wrong.items()]


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


def arrivals_by_bin(specs: list[RequestSpec], bin_s: float) -> np.ndarray:
    """Arrivals per `bin_s` bin of arrival time (good_by_arrival's bins)."""
    return np.bincount([int(s.arrival_s // bin_s) for s in specs])


def window_ends(arrivals: np.ndarray, bin_s: float) -> list[int]:
    """Per bin i, the end (exclusive) of the goodput window starting there: at least RATE_WINDOW_S
    long and holding at least WINDOW_REQUESTS arrivals, counted (a phase or an hour at a fifth of
    the rate needs a window five times as long; sized by the run's mean rate, shift's summarization
    phase was judged on windows of ~20 requests, where one request is 5%); only windows that end
    within the run."""
    width, total, ends = max(1, int(RATE_WINDOW_S // bin_s)), np.cumsum(np.concatenate([[0], arrivals])), []
    for i in range(len(arrivals)):
        end = max(i + width, int(np.searchsorted(total, total[i] + WINDOW_REQUESTS)))
        if end > len(arrivals):
            break
        ends.append(end)
    return ends


def convergence_bin(tuned: np.ndarray, static: np.ndarray, ends: list[int], earliest: int = 0) -> int | None:
    """The first bin, not before `earliest`, from which every window (window_ends: one starting at
    each bin, within the run) has tuned serving >= CONVERGED x the static run's good requests; None
    if there is none."""
    ok = [tuned[i:end].sum() >= CONVERGED * static[i:end].sum() for i, end in enumerate(ends)]
    return next((first for first in range(earliest, len(ok)) if all(ok[first:])), None)


def earliest_convergence_bin(changes: list[ConfigurationChange], start_loses: bool, bin_s: float) -> int | None:
    """A tuned run has not converged while it still holds a start that, held, serves < CONVERGED x
    the best static: not before the first bin boundary at or after its first change (None: it never
    changed); any bin for a start that is good enough as it is."""
    if not start_loses:
        return 0
    return math.ceil(changes[0].at_s / bin_s) if changes else None


def run_cell(specs: list[RequestSpec], cost: StepTimeModel, slo: SloClass, start: Start,
             static_records: list[RequestRecord], static_good: np.ndarray, static_goodput: float, ends: list[int],
             seed: int, speculation: SpeculationModel | None = None) -> dict[str, Any]:
    """One start: tuned from it, and left alone."""
    with tempfile.TemporaryDirectory() as state:
        t0 = time.perf_counter()
        controller, records, end = tune_on_simulator(specs, cost, state, slo, ControllerSettings.load(),
                                                     load_search_space(max_token_budget=None), seed,
                                                     initial=start.knobs, initial_policy=start.policy,
                                                     speculation=speculation)
        wall = time.perf_counter() - t0
    tuned = summarize_requests(records, slo, end - specs[0].arrival_s)
    alone = evaluate_static(specs, cost, start.policy, start.knobs, slo, speculation=speculation)
    good = good_by_arrival(specs, records, slo, BIN_S)
    changes = controller.target.changes
    earliest = earliest_convergence_bin(changes, alone.goodput_rps < CONVERGED * static_goodput, BIN_S)
    first = None if earliest is None else convergence_bin(good, static_good, ends, earliest)
    cell = {"start": start.name, "tuned_goodput_rps": tuned.goodput_rps, "tuned_over_best_static":
            tuned.goodput_rps / static_goodput if static_goodput else None,
            "left_alone_goodput_rps": alone.goodput_rps,
            "wrong_start_loss": static_goodput / alone.goodput_rps if alone.goodput_rps else float("inf"),
            "convergence_s": None, "after_convergence_over_best_static": None,
            "violating_bins_after_convergence": None, "tuning_windows": controller.windows,
            "first_change_s": changes[0].at_s if changes else None,
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
    slo = cpu_slo(workload, args) if hardware == "cpu" else SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.gpu_slo_tbt_s)
    capacity = simulated_capacity(wl, cost, slo, args.seed)
    qps = args.load * capacity
    duration = max(args.duration, args.min_requests / qps)      # a low rate needs longer to say anything
    specs = generate(wl, qps=qps, duration_s=duration, seed=args.seed)
    drafts = workload_speculation(workload) if args.speculation else None
    grid = static_grid(specs, cost, load_search_space(max_token_budget=None), "deadline", slo, speculation=drafts)
    best_params, best = best_of(grid)
    static_records = simulate(specs, cost, "deadline", SHIPPED_KNOBS.replace(**best_params), slo, speculation=drafts).records
    static_good = good_by_arrival(specs, static_records, slo, BIN_S)
    ends = window_ends(arrivals_by_bin(specs, BIN_S), BIN_S)
    cells = [run_cell(specs, cost, slo, s, static_records, static_good, best.goodput_rps, ends, args.seed, drafts)
             for s in starts(args.speculation)]
    return {"hardware": hardware, "workload": workload, "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
            **({"speculation": asdict(drafts)} if drafts else {}),
            "capacity_qps": capacity, "load": args.load, "qps": qps, "num_requests": len(specs),
            "duration_s": duration, "window": {"min_s": RATE_WINDOW_S, "min_arrivals": WINDOW_REQUESTS},
            "best_static_knobs": best_params,
            "best_static_goodput_rps": best.goodput_rps, "best_static_slo_attainment": best.slo_attainment,
            "missed_alone": missed_alone(specs, cost, slo), "cells": cells}


def grid_floor(hardware: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """Each configuration of the static grid judged as if it were a tuned run, against the best
    one: what the convergence criterion makes of a configuration held from the first second. Where
    the grid's near-best configurations (within 2% of the best's goodput) themselves "converge"
    late or never, a tuned cell holding one of them misses the bars on the criterion's noise (100
    arrivals a window at low rates: +-4% between configurations on the same requests), not on
    what it serves."""
    cost, wl = cost_model(hardware), load_workload(workload)
    slo = cpu_slo(workload, args) if hardware == "cpu" else SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.gpu_slo_tbt_s)
    qps = args.load * simulated_capacity(wl, cost, slo, args.seed)
    specs = generate(wl, qps=qps, duration_s=max(args.duration, args.min_requests / qps), seed=args.seed)
    space = load_search_space(max_token_budget=None)
    runs = [(params, simulate(specs, cost, "deadline", SHIPPED_KNOBS.replace(**params), slo))
            for params in grid_params(space, "deadline")]
    _, best = max(runs, key=lambda run: run[1].summary.goodput_rps)
    best_good = good_by_arrival(specs, best.records, slo, BIN_S)
    ends = window_ends(arrivals_by_bin(specs, BIN_S), BIN_S)
    rows = []
    for params, run in runs:
        good = good_by_arrival(specs, run.records, slo, BIN_S)
        first = convergence_bin(good, best_good, ends)
        rows.append({"knobs": {k: params[k] for k in ("token_budget", "step_headroom", "error_budget")},
                     "over_best_static": run.summary.goodput_rps / best.summary.goodput_rps,
                     "convergence_s": None if first is None else first * BIN_S,
                     "after_convergence_over_best_static": None if first is None else
                     good[first:].sum() / best_good[first:].sum()})
    return {"hardware": hardware, "workload": workload, "qps": qps, "grid_floor": rows}


def provenance() -> dict[str, dict]:
    """Which machine, commit and command produced a result (each line is appended on its own)."""
    return {"meta": results_file.meta()}


def done_pairs(out: Path) -> set[tuple[str, str, bool]]:
    """(hardware, workload, with a drafter) of the rows already in `out`."""
    if not out.exists():
        return set()
    return {(r["hardware"], r["workload"], "speculation" in r)
            for r in map(json.loads, out.read_text().splitlines()) if "cells" in r}


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
    p.add_argument("--long-prompt-ttft-s", type=float, default=None,
                   help="TTFT SLO of the CPU's long-prompt workloads (%s; default: the shipped batch class's)"
                   % ", ".join(LONG_PROMPT_WORKLOADS))
    p.add_argument("--gpu-slo-tbt-s", type=float, default=0.1, help="TBT SLO on GPU profiles (default 0.1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON lines, one per (hardware, workload); appended")
    p.add_argument("--speculation", action="store_true", help="every run drafts as configs/speculation.yaml "
                   "measured for the workload; the grid and the starts gain speculation settings")
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
            if (hardware, workload, args.speculation) in done:
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
