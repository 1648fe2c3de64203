"""Live step times against the cost model, by kind of step, on the real daemon (docs/design/cost_models.md,
"Live step-time scatter"): how far decode-only steps and steps carrying prefill chunks of a few sizes
run from the prediction of the daemon's calibration, at the median and the 90th/99th percentiles.
The live cost model pools all of them into one scatter; this shows whether one distribution fits.

    python benchmarks/step_ratios.py --qps 1.875 --num-requests 240 --json docs/results/step_ratios_xeon.json

The daemon (`--no-tune`, its defaults unless --serve-arg says otherwise) runs in a child process
(`python -P`) whose live cost model also writes every step's duration and prediction to a JSON-lines
file; seeded chat requests come from `autotuned-serve bench`. Steps with nothing running are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# prefill tokens in the step: decode-only, then chunk sizes
BUCKETS = ((0, 0), (1, 64), (65, 128), (129, 256), (257, 1 << 30))


def serve_logged(log_path: str, argv: list[str]) -> int:
    """The daemon, its live cost model writing each step's record and prediction to `log_path`."""
    from serving.cli import main
    from simulation.cost_model import StepShape
    from simulation.live_cost_model import LiveCostModel

    out = open(log_path, "w", buffering=1)   # a line a step: nothing is flushed at the daemon's exit
    on_step = LiveCostModel.on_step

    def logged(self: LiveCostModel, record) -> None:
        on_step(self, record)
        out.write(json.dumps({"duration_s": record.duration_s, "predicted_s": self.base.predict(StepShape.of(record)),
                              "prefill": record.num_prefill_tokens, "running": record.num_running}) + "\n")

    LiveCostModel.on_step = logged
    return main(argv)


def run_daemon_and_bench(args: argparse.Namespace, workdir: str, log_path: str) -> dict:
    # imported here, in the parent only: the child runs this file under -P, without its folder on sys.path
    from server_health import wait_healthy

    serve = ["serve", "--state-dir", os.path.join(workdir, "state"), "--port", str(args.port), "--no-tune",
             *args.serve_arg]
    with open(os.path.join(workdir, "daemon.log"), "w") as daemon_log:
        proc = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), "--serve-logged", log_path, "--", *serve],
                                stdout=daemon_log, stderr=subprocess.STDOUT)
        try:
            if not wait_healthy(proc, f"http://127.0.0.1:{args.port}/health", 600, "the daemon", daemon_log.name):
                raise RuntimeError(f"the daemon was not healthy within 600 s; see {daemon_log.name}")
            bench = subprocess.run([sys.executable, "-P", "-m", "serving.cli", "bench", "--base-url",
                                    f"http://127.0.0.1:{args.port}", "--qps", str(args.qps), "--num-requests",
                                    str(args.num_requests), "--seed", str(args.seed), "--no-progress"],
                                   capture_output=True, text=True, check=True)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    return json.loads(bench.stdout[bench.stdout.index("{"):])


def ratios_by_kind(steps: list[dict]) -> list[dict]:
    """ratio_row of each bucket of prefill tokens that has steps."""
    buckets = [(bounds, [s for s in steps if bounds[0] <= s["prefill"] <= bounds[1]]) for bounds in BUCKETS]
    return [{"prefill_tokens": list(bounds)} | ratio_row(kind) for bounds, kind in buckets if kind]


def ratio_row(steps: list[dict]) -> dict:
    """Their count, median duration, and live over predicted at p50/p90/p99."""
    ratio = np.array([s["duration_s"] / s["predicted_s"] for s in steps])
    p50, p90, p99 = np.percentile(ratio, (50, 90, 99))
    return {"steps": len(steps), "duration_p50_s": float(np.median([s["duration_s"] for s in steps])),
            "ratio_p50": float(p50), "ratio_p90": float(p90), "ratio_p99": float(p99), "p90_over_p50": float(p90 / p50)}


def main() -> None:
    if sys.argv[1:2] == ["--serve-logged"]:
        sys.exit(serve_logged(sys.argv[2], sys.argv[4:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qps", type=float, default=1.875)
    p.add_argument("--num-requests", type=int, default=240)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=8031)
    p.add_argument("--serve-arg", action="append", default=[], help="passed to `serve` (repeat: --serve-arg=--token-budget --serve-arg=64)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from bench_common import emit_summary

    with tempfile.TemporaryDirectory() as workdir:
        log_path = os.path.join(workdir, "steps.jsonl")
        bench = run_daemon_and_bench(args, workdir, log_path)
        with open(log_path) as f:
            steps = [s for s in map(json.loads, f) if s["running"] > 0]
    pooled = {"prefill_tokens": "all"} | ratio_row(steps)
    emit_summary({"qps": args.qps, "num_requests": args.num_requests, "serve_args": args.serve_arg,
                  "bench": {k: bench[k] for k in ("ttft_p50_s", "tbt_p99_s", "slo_attainment", "request_throughput_rps")},
                  "pooled": pooled, "by_prefill_tokens": ratios_by_kind(steps)}, args.json)


def render_doc(sources: list[Path]) -> str:
    """docs/design/cost_models.md's table (benchmarks/render_docs.py): live over predicted by kind of step."""
    r = json.loads(Path(sources[0]).read_text())
    m = r["meta"]["machine"]

    def kind(bounds) -> str:
        if bounds == "all":
            return "all, pooled"
        lo, hi = bounds
        return "decode only" if hi == 0 else f"with {lo} or more prefill tokens" if hi >= 1 << 30 \
            else f"with {lo}-{hi} prefill tokens"

    lines = [f"The daemon's defaults (`--no-tune`), chat at {r['qps']:g} requests/s, {r['num_requests']} requests, "
             f"on {m['cpu_model']}, {m['cores']} cores.", "",
             "| steps | count | median duration | live/predicted p50 | p90 | p99 | p90 over p50 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in r["by_prefill_tokens"] + [r["pooled"]]:
        lines.append(f"| {kind(row['prefill_tokens'])} | {row['steps']} | {1e3 * row['duration_p50_s']:.0f} ms | "
                     f"{row['ratio_p50']:.2f} | {row['ratio_p90']:.2f} | {row['ratio_p99']:.2f} | "
                     f"{row['p90_over_p50']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
