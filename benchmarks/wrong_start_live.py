"""The zero-config claim on the REAL daemon: started from a configuration an operator might wrongly
pick (benchmarks/zero_config.py's WRONG_STARTS), with the tuner on, at a fixed chat rate near
capacity, how long until it meets the SLO again?

Each start gets its own daemon (bundled SmolLM2, fresh state dir, same port, one after another) and
the same seeded open-loop chat requests. Per start: the client's 30-s bins (by finish time),
each met when its P50 TTFT and P99 TBT are within the SLO; `slo_met_again_s` is the end of the first
bin after which every bin met it (None: the run ended on a missed bin); goodput and SLO
attainment over the run and after that point; the controller's own decisions (its tuning windows).

    python benchmarks/wrong_start_live.py --qps 0.8 --duration 480 --json docs/results/wrong_start_live.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

from bench_common import MachineInfo, emit_summary
from autotuner.simulated_tuning import BIN_S, bin_verdicts
from loadgen.bench_client import make_prompts
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import generate, load_workload
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass
from tuning_shift import bench_daemon, controller_windows
from zero_config import WRONG_STARTS

STARTS = {"defaults": (None, {}), **WRONG_STARTS}   # defaults: the shipped policy and knobs (the reference)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qps", type=float, default=0.8, help="chat rate, near the daemon's capacity (default 0.8)")
    p.add_argument("--duration", type=float, default=480.0, help="seconds of arrivals per start (default 480)")
    p.add_argument("--start", action="append", default=[], metavar="NAME=POLICY:KNOB=VALUE,...",
                   help="one more named start for --starts/--left-alone (e.g. a configuration the tuner picked)")
    p.add_argument("--starts", nargs="*", default=list(WRONG_STARTS), help=f"run each with the tuner on: {list(STARTS)}")
    p.add_argument("--left-alone", nargs="*", default=[],
                   help="run each with the tuner off, on the same requests: what a wrong start loses left alone, "
                        "and with `defaults` what the load itself costs the shipped configuration")
    p.add_argument("--carry-from", default=None, metavar="JSON",
                   help="an earlier run of this script on the same requests (qps, duration, seed, SLO): its "
                        "runs (tuned or left alone) of starts not run so here are carried over, marked")
    p.add_argument("--cost-model", default=None, metavar="JSON",
                   help="a calibration (a state dir's cost_models/*.json) every daemon starts with instead of "
                        "calibrating at its start-up: the runs then differ by code and load, not by their fits")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--port", type=int, default=8132)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    try:
        STARTS.update(parse_start(text) for text in args.start)
    except ValueError as e:
        p.error(f"--start {args.start}: {e} (expected NAME=POLICY:KNOB=VALUE,...)")
    unknown = sorted(set(args.starts + args.left_alone) - set(STARTS))
    if unknown:
        p.error(f"unknown start(s) {unknown}: choose from {list(STARTS)} or name one with --start")
    return args


def parse_start(text: str) -> tuple[str, tuple[str, dict[str, float]]]:
    """NAME=POLICY:KNOB=VALUE,... as (name, (policy, knobs))."""
    name, _, rest = text.partition("=")
    policy, _, knobs = rest.partition(":")
    pairs = [item.split("=") for item in knobs.split(",") if item]
    if not name or not policy or any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"cannot read {text!r}")
    return name, (policy, {key: float(value) if "." in value else int(value) for key, value in pairs})


def met_again_s(verdicts: list[bool]) -> float | None:
    """The end of the first bin after which every bin met the SLO (0: all did)."""
    if not verdicts or not verdicts[-1]:
        return None
    last_miss = max((i for i, ok in enumerate(verdicts) if not ok), default=-1)
    return (last_miss + 1) * BIN_S


def run_start(name: str, specs: list, prompts: list, slo: SloClass, args: argparse.Namespace) -> dict:
    policy, knobs = STARTS[name]
    run, records, state_dir, workdir = serve_from(name, True, specs, prompts, slo, args)
    verdicts = bin_verdicts(records, slo, BIN_S)
    recovered = met_again_s(verdicts)
    after = [r for r in records if recovered is not None and r.arrival >= recovered]
    summary_after = summarize_requests(after, slo, args.duration - recovered) if after else None
    result = {"policy": policy, "knobs": knobs, "goodput_rps": run.summary.goodput_rps,
              "slo_attainment": run.summary.slo_attainment, "failed": run.summary.num_failed,
              "bins_met": verdicts, "slo_met_again_s": recovered,
              "slo_attainment_after": summary_after.slo_attainment if summary_after else None,
              "controller": controller_windows(state_dir), "workdir": workdir}
    print(f"{name}: met again at {recovered} s; bins {''.join('+' if v else '-' for v in verdicts)}; "
          f"attainment {run.summary.slo_attainment}", file=sys.stderr)
    return result


def serve_from(name: str, tune: bool, specs: list, prompts: list, slo: SloClass, args: argparse.Namespace):
    """One daemon started from the named configuration, serving `specs`: (run, records, state dir, workdir)."""
    policy, knobs = STARTS[name]
    workdir = tempfile.mkdtemp(prefix=f"wrong_start_{name}_{'tuned' if tune else 'alone'}_")
    state_dir = seeded_state_dir(workdir, args.cost_model)
    settings = {"port": args.port, "state_dir": state_dir, "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
                "tune": tune} | ({"policy": policy, "knobs": knobs} if policy else {})
    run, records = bench_daemon(settings, workdir, specs, prompts, slo, drain_s=300)
    return run, records, state_dir, workdir


def seeded_state_dir(workdir: str, cost_model: str | None) -> str:
    """A daemon's fresh state dir, holding `cost_model` as a stored calibration (the daemon then uses it
    instead of calibrating at its start-up, as a daemon restarted on its state dir does)."""
    state_dir = os.path.join(workdir, "state")
    if cost_model:
        os.makedirs(os.path.join(state_dir, "cost_models"))
        shutil.copy(cost_model, os.path.join(state_dir, "cost_models"))
    return state_dir


def run_left_alone(name: str, specs: list, prompts: list, slo: SloClass, args: argparse.Namespace) -> dict:
    """The same start with the tuner off: what it costs when nobody corrects it."""
    run, records, _, workdir = serve_from(name, False, specs, prompts, slo, args)
    verdicts = bin_verdicts(records, slo, BIN_S)
    print(f"{name} left alone: bins {''.join('+' if v else '-' for v in verdicts)}; "
          f"attainment {run.summary.slo_attainment}", file=sys.stderr)
    return {"goodput_rps": run.summary.goodput_rps, "slo_attainment": run.summary.slo_attainment,
            "failed": run.summary.num_failed, "bins_met": verdicts, "workdir": workdir}


def carry_over(results: dict[str, dict], path: str, args: argparse.Namespace, num_requests: int) -> None:
    """Runs of an earlier run of this script on the same requests, for the starts (tuner on) and
    left-alone runs not made here, each marked with where it came from (its file, commit and date;
    one the earlier run carried keeps its own origin)."""
    with open(path) as f:
        earlier = json.load(f)
    same = (earlier["qps"], earlier["duration_s"], earlier["num_requests"], earlier["slo"], seed_of(earlier)) == \
        (args.qps, args.duration, num_requests, {"ttft_s": args.slo_ttft_s, "tbt_s": args.slo_tbt_s}, args.seed)
    if not same:
        raise SystemExit(f"{path}: not a run on the same requests (qps, duration, seed, SLO)")
    source = {"file": path, "commit": earlier["meta"].get("commit"), "date_utc": earlier["meta"].get("date_utc")}
    for name, then in earlier["results"].items():
        here = results.setdefault(name, {})
        if "controller" in then and "controller" not in here:
            here |= {k: v for k, v in then.items() if k != "left_alone"}
            here.setdefault("carried_from", source)
        if "left_alone" in then and "left_alone" not in here:
            here["left_alone"] = {"carried_from": source} | then["left_alone"]
        if not here:
            del results[name]


def seed_of(run: dict) -> int:
    """A run's request seed (files before it was recorded: from its command line, else the default 0)."""
    if "seed" in run:
        return run["seed"]
    words = run["command"].split()
    return int(words[words.index("--seed") + 1]) if "--seed" in words else 0


def main() -> None:
    args = parse_args()
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    specs = generate(load_workload("chat"), args.qps, duration_s=args.duration, seed=args.seed)
    prompts = make_prompts(specs, PromptSource(load_prompt_tokenizer(None), args.seed), text=False)
    results = {name: run_start(name, specs, prompts, slo, args) for name in args.starts}
    for name in args.left_alone:
        results.setdefault(name, {})["left_alone"] = run_left_alone(name, specs, prompts, slo, args)
    if args.carry_from:
        carry_over(results, args.carry_from, args, len(specs))
    emit_summary({"machine": MachineInfo.collect().as_dict(), "command": " ".join(["python", *sys.argv]),
                  "workload": "chat", "qps": args.qps, "duration_s": args.duration, "seed": args.seed,
                  "num_requests": len(specs),
                  "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s}, "results": results}, args.json)


if __name__ == "__main__":
    main()
