"""What the tuner's warm start costs serving on the REAL daemon: chat at 0.4 requests/s for a few
minutes, once per variant, each on its own fresh daemon (bundled SmolLM2, shipped default.yaml, a
fresh state dir, so the first regime, about context_window_s into the run, starts the warm start):

  background   the warm start in a separate low-priority process (the daemon's default)
  in_process   the warm start in the tuner's thread of the serving process (the old way)
  disabled     no warm start (warm_start_trials 0)

The tuner is paused as soon as the daemon is up: the warm start still runs when the regime is
entered, but no trial is applied, so the runs differ only in the warm start's compute, not in the
knobs served. Reported: client-side TBT P50 and P99 over the whole run and while the warm start ran
(its start and end from the daemon's log; for `disabled`, the same span of the run as the first
variant that had one), their ratios to `disabled`, and the share of the CPU other processes used
meanwhile (anything above a few percent distorts the comparison: run it on a quiet machine).

    python benchmarks/warm_start_interference.py --json /tmp/warm_start_interference.json
    python benchmarks/warm_start_interference.py --quick      # a 60-s check that the script works
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import yaml

from bench_common import MachineInfo, OtherLoad, emit_summary
from tuning_shift import start_daemon, stop_daemon
from loadgen.bench_client import BenchOptions, make_prompts, run_bench
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from autotuner.search_space import CONFIG as TUNING_CONFIG
from autotuner.tuner_service import TUNING_CONFIG_ENV
from loadgen.workload import generate, load_workload
from engine.slo_class import SloClass

DEFAULT_SETTINGS = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
VARIANTS = {"background": {"background": True}, "in_process": {"background": False},
            "disabled": {"warm_start_trials": 0}}
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*tuner: warm start (for|done)")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--qps", type=float, default=0.4)
    p.add_argument("--duration-s", type=float, default=300.0, help="arrivals span this long (default 300)")
    p.add_argument("--warm-start-trials", type=int, default=None, help="default: configs/tuning.yaml's")
    p.add_argument("--context-window-s", type=float, default=None,
                   help="the regime (and warm start) starts this long after start-up (default: tuning.yaml's)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke test: 60 s of arrivals, the regime entered after 40 s, 8 simulated trials")
    p.add_argument("--port", type=int, default=8132)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.quick:
        args.duration_s, args.context_window_s = 60.0, args.context_window_s or 40.0
        args.warm_start_trials = args.warm_start_trials or 8
    return args


def tuning_config(variant: str, args: argparse.Namespace, workdir: str) -> str:
    """configs/tuning.yaml with this variant's controller settings."""
    data = yaml.safe_load(TUNING_CONFIG.read_text())
    overrides = {"warm_start_trials": args.warm_start_trials, "context_window_s": args.context_window_s}
    data["controller"] |= {k: v for k, v in overrides.items() if v is not None} | VARIANTS[variant]
    path = os.path.join(workdir, "tuning.yaml")
    Path(path).write_text(yaml.safe_dump(data))
    return path


def warm_start_span(daemon_log: str) -> tuple[float, float] | None:
    """(start, end) of the warm start on this process's monotonic clock, from the daemon's log."""
    times = {}
    for line in Path(daemon_log).read_text().splitlines():
        if m := LOG_LINE.match(line):
            wall = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            times.setdefault(m[2], wall - (time.time() - time.monotonic()))
    return (times["for"], times["done"]) if {"for", "done"} <= times.keys() else None


def tbt(gaps: list[float]) -> dict[str, float | int | None]:
    return {"tbt_p50_s": float(np.percentile(gaps, 50)) if gaps else None,
            "tbt_p99_s": float(np.percentile(gaps, 99)) if gaps else None, "gaps": len(gaps)}


def run_variant(variant: str, specs, prompts, slo: SloClass, args: argparse.Namespace,
                span_offsets: tuple[float, float] | None) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"warm_start_{variant}_")
    settings = yaml.safe_load(DEFAULT_SETTINGS.read_text()) | {
        "port": args.port, "state_dir": os.path.join(workdir, "state"), "tune": True,
        "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s}}
    os.environ[TUNING_CONFIG_ENV] = tuning_config(variant, args, workdir)   # the daemon inherits it
    others = OtherLoad()               # the daemon and its children count as ours once it is reaped
    proc = start_daemon(settings, workdir)
    try:
        url = f"http://127.0.0.1:{args.port}"
        httpx.post(url + "/admin/tuning/pause", timeout=10).raise_for_status()   # no trial is ever applied
        options = BenchOptions(url, max_duration_s=specs[-1].arrival_s + 300, progress=False)
        run = run_bench(specs, prompts, options, slo)
    finally:
        stop_daemon(proc)
    records = [r.record(run.start + options.max_duration_s) for r in run.results]
    timed = [(b, b - a) for r in records for a, b in zip(r.token_times, r.token_times[1:])]
    span = ran = warm_start_span(os.path.join(workdir, "daemon.log"))
    if span is None and span_offsets is not None:        # no warm start here: the same span of the run
        span = (run.start + span_offsets[0], run.start + span_offsets[1])
    if ran is None and variant != "disabled":
        print(f"{variant}: the warm start did not run (too few finished requests when the regime was entered?)",
              file=sys.stderr)
    result = {**tbt([g for _, g in timed]), "num_requests": len(records), "failed": run.summary.num_failed,
              "ttft_p50_s": run.summary.ttft_p50_s, "other_cpu_share": round(others.share(), 3),
              "workdir": workdir, "warm_start_ran": ran is not None,
              "warm_start_span_s": None if span is None else [round(t - run.start, 1) for t in span]}
    if span is not None:
        result["during_warm_start"] = tbt([g for t, g in timed if span[0] <= t <= span[1]])
    print(f"{variant}: {result}", file=sys.stderr, flush=True)
    return result


def ratios(results: dict, key: str) -> dict:
    base = results.get("disabled", {})
    out = {}
    for name, r in results.items():
        for scope, a, b in (("run", r, base), ("during_warm_start", r.get("during_warm_start", {}),
                                                base.get("during_warm_start", {}))):
            if name != "disabled" and a.get(key) and b.get(key):
                out[f"{name}/{scope}"] = round(a[key] / b[key], 3)
    return out


def main() -> None:
    args = parse_args()
    slo = SloClass(**yaml.safe_load(DEFAULT_SETTINGS.read_text())["slo"])
    specs = generate(load_workload("chat"), args.qps, duration_s=args.duration_s, seed=args.seed)
    prompts = make_prompts(specs, PromptSource(load_prompt_tokenizer(None), args.seed), text=False)
    results: dict[str, dict] = {}
    offsets = None
    for variant in sorted(args.variants, key=lambda v: v == "disabled"):   # disabled last: it borrows a span
        results[variant] = result = run_variant(variant, specs, prompts, slo, args, offsets)
        if offsets is None and result["warm_start_span_s"]:
            offsets = tuple(result["warm_start_span_s"])
    emit_summary({"machine": MachineInfo.collect().as_dict(), "qps": args.qps, "duration_s": args.duration_s,
                  "num_requests": len(specs), "slo": {"ttft_s": slo.ttft_s, "tbt_s": slo.tbt_s},
                  "results": results, "tbt_p99_over_disabled": ratios(results, "tbt_p99_s"),
                  "tbt_p50_over_disabled": ratios(results, "tbt_p50_s")}, args.json)


if __name__ == "__main__":
    main()
