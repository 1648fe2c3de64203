"""What limits the online tuner on a workload: the same `tune --simulate` run (same requests, same
simulator) with one controller setting or the search space changed at a time, next to the best
static configuration of the tuned policy's grid and that policy at its default knobs.

Variants (default: all):
  shipped         configs/tuning.yaml as it is (what `tune --simulate` runs)
  always-explore  nothing_to_win above 1: trust-region trials go on around an incumbent that already
                  serves every request within the SLO
  no-warm-start   warm_start_trials 0: no simulated search on entering a regime; the controller
                  explores live from the knobs it holds
  policy-knobs    the search space without the serving knobs max_num_seqs and kv_admission_watermark
  wide-trust      trust_radius 0.3 (shipped 0.15)
  long-windows    min_window_s 30 (shipped 10): each measurement spans more requests
  long-windows+policy-knobs   both of these

    python benchmarks/tuning_sensitivity.py --profile a100-mistral-7b --workload shift-gpu --qps 1.9 --duration 900 --slo-tbt-s 0.1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

from autotuner.controller import ControllerSettings
from autotuner.search_space import SearchSpace, load_search_space
from autotuner.simulated_tuning import (best_of, evaluate_static, good_by_phase, static_grid, tune_on_simulator,
                                        violating_bin_fraction)
from simulation.cost_model_files import resolve_cost_model
from loadgen.workload import generate, load_workload
from policies import Knobs
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass

SERVING_KNOBS = ("max_num_seqs", "kv_admission_watermark")
VARIANTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {   # settings overrides, knobs left out
    "shipped": ({}, ()),
    "always-explore": ({"nothing_to_win": 1.01}, ()),
    "no-warm-start": ({"warm_start_trials": 0}, ()),
    "policy-knobs": ({}, SERVING_KNOBS),
    "wide-trust": ({"trust_radius": 0.3}, ()),
    "long-windows": ({"min_window_s": 30.0}, ()),
    "long-windows+policy-knobs": ({"min_window_s": 30.0}, SERVING_KNOBS),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="a100-mistral-7b")
    p.add_argument("--workload", default="shift-gpu")
    p.add_argument("--qps", type=float, default=None)
    p.add_argument("--duration", type=float, default=900.0)
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.1)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def without(space: SearchSpace, names: tuple[str, ...]) -> SearchSpace:
    return SearchSpace(tuple(r for r in space.ranges if r.name not in names), space.policies)


def main() -> None:
    args = parse_args()
    cost = resolve_cost_model(None, args.profile)
    specs = generate(load_workload(args.workload), qps=args.qps, duration_s=args.duration, seed=args.seed)
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    space = load_search_space(max_token_budget=None)
    shipped = ControllerSettings.load()
    start = time.perf_counter()
    static_params, static = best_of(static_grid(specs, cost, space, shipped.policy, slo))
    default = evaluate_static(specs, cost, shipped.policy, Knobs(), slo)
    print(json.dumps({"profile": args.profile, "workload": args.workload, "qps": args.qps,
                      "num_requests": len(specs), "policy": shipped.policy,
                      "best_static": {"goodput_rps": round(static.goodput_rps, 3), "knobs": static_params,
                                      "violating_bin_fraction": round(static.violating_bin_fraction, 3),
                                      "good_by_phase": static.good_by_phase},
                      "policy_defaults": {"goodput_rps": round(default.goodput_rps, 3),
                                          "violating_bin_fraction": round(default.violating_bin_fraction, 3),
                                          "good_by_phase": default.good_by_phase},
                      "wall_s": round(time.perf_counter() - start, 1)}))
    for name in args.variants:
        overrides, dropped = VARIANTS[name]
        settings = ControllerSettings.load(**overrides)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"tuning_sensitivity_{name}_") as state_dir:
            controller, records, end = tune_on_simulator(specs, cost, state_dir, slo, settings,
                                                         without(space, dropped), args.seed)
        tuned = summarize_requests(records, slo, end - specs[0].arrival_s)
        print(json.dumps({"variant": name, "goodput_rps": round(tuned.goodput_rps, 3),
                          "over_best_static": round(tuned.goodput_rps / static.goodput_rps, 3),
                          "violating_bin_fraction": round(violating_bin_fraction(records, slo), 3),
                          "unsafe_tuning_windows": f"{controller.violations}/{controller.windows}",
                          "good_by_phase": good_by_phase(specs, records, slo),
                          "wall_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    main()
