"""Deadline-aware steps on the REAL daemon: the same seeded chat requests served by the deadline
policy (inner loop on, no tuner) and by plain token budgets (Sarathi-Serve's stall-free batching,
inner loop off), one fresh daemon after another on the bundled SmolLM2. Reported per configuration:
P50 TTFT and P99 TBT (Sarathi-Serve's capacity criterion at this rate), goodput and SLO attainment.

    python benchmarks/deadline_daemon.py --qps 0.3 --num-requests 60 --configs deadline sarathi-32 sarathi-24

With --rounds N the configurations alternate N times (A B A B ...), each round on the same requests:
a paired comparison, since one configuration's P99 TBT moves between runs on a shared machine by
more than most differences between configurations. Each configuration's result is then the list
of its rounds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import replace

import yaml

from bench_common import MachineInfo, emit_summary
from tuning_shift import start_daemon, stop_daemon
from autotuner.simulated_tuning import violating_bin_fraction
from loadgen.bench_client import BenchOptions, BenchRun, make_prompts, run_bench
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import generate, load_workload
from engine.slo_class import SloClass


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="chat")
    p.add_argument("--qps", type=float, default=0.3)
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--configs", nargs="+", default=["deadline", "sarathi-32"],
                   help="deadline, or sarathi-N for a plain token budget of N; knobs after a colon, "
                        "comma-separated (deadline:step_headroom=0.8,error_budget=1.0)")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--rounds", type=int, default=1, help="run the configurations alternately this many times")
    p.add_argument("--port", type=int, default=8013)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def settings_for(name: str, slo: SloClass, port: int, state_dir: str) -> dict:
    """`deadline` or `sarathi-N`, then optional knobs after a colon: `deadline:step_headroom=0.8`."""
    common = {"port": port, "state_dir": state_dir, "tune": False, "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s}}
    name, _, overrides = name.partition(":")
    extra = {k: yaml.safe_load(v) for k, _, v in (pair.partition("=") for pair in overrides.split(",") if pair)}
    if name == "deadline":
        return common | {"policy": "deadline", "knobs": {"token_budget": 2048} | extra}
    policy, _, budget = name.partition("-")
    return common | {"policy": policy, "knobs": {"token_budget": int(budget)} | extra}


def bins_meeting_slo(run: BenchRun, slo: SloClass) -> dict[str, float]:
    """Per SLO class, the share of 30-s bins (by finish time) whose P50 TTFT and P99 TBT met the
    class's targets (the run's SLO for the default class), as `tune --simulate` counts violating
    bins (pooled over the requests that produced tokens)."""
    end = max((r.finished for r in run.results if r.finished is not None), default=run.start)
    # bins from the run's start: violating_bin_fraction counts them from time 0
    records = [replace(record, finished=record.finished - run.start) for record in (r.record(end) for r in run.results)]
    by_class: dict[str, list] = {}
    for record in records:
        by_class.setdefault(record.slo_class, []).append(record)
    return {name: 1.0 - violating_bin_fraction(group, SloClass(ttft_s=group[0].slo_ttft_s or slo.ttft_s,
                                                            tbt_s=group[0].slo_tbt_s or slo.tbt_s))
            for name, group in by_class.items()}


def run_one(name: str, specs, prompts, slo: SloClass, args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"deadline_daemon_{name}_")
    proc = start_daemon(settings_for(name, slo, args.port, os.path.join(workdir, "state")), workdir)
    try:
        options = BenchOptions(f"http://127.0.0.1:{args.port}", max_duration_s=specs[-1].arrival_s + 600,
                               progress=False)
        run = run_bench(specs, prompts, options, slo)
    finally:
        stop_daemon(proc)
    summary = run.summary
    result = {"ttft_p50_s": summary.ttft_p50_s, "tbt_p99_s": summary.tbt_p99_s, "tbt_p50_s": summary.tbt_p50_s,
              "goodput_rps": summary.goodput_rps, "slo_attainment": summary.slo_attainment,
              "failed": summary.num_failed, "by_class": summary.by_class,
              "bins_meeting_slo": bins_meeting_slo(run, slo),
              "meets_capacity_criterion": bool(summary.ttft_p50_s is not None and summary.ttft_p50_s <= slo.ttft_s
                                               and summary.tbt_p99_s is not None and summary.tbt_p99_s <= slo.tbt_s)}
    print(f"{name}: {result}", file=sys.stderr)
    return result


def main() -> None:
    args = parse_args()
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    specs = generate(load_workload(args.workload), args.qps, num_requests=args.num_requests, seed=args.seed)
    prompts = make_prompts(specs, PromptSource(load_prompt_tokenizer(None), args.seed), text=False)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    rounds = [{name: run_one(name, specs, prompts, slo, args) for name in args.configs} for _ in range(args.rounds)]
    results = rounds[0] if args.rounds == 1 else {name: [r[name] for r in rounds] for name in args.configs}
    emit_summary({"machine": MachineInfo.collect().as_dict(), "workload": args.workload, "qps": args.qps,
                  "num_requests": len(specs), "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
                  "results": results}, args.json)


if __name__ == "__main__":
    main()
