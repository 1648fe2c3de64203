"""Soak: the daemon on the bundled model under an open-loop load past its capacity, for a long time,
with clients that disconnect mid-stream, malformed and invalid requests, and bursts.

    python benchmarks/soak.py --duration-s 1800 --json docs/results/soak.json

By default: the sustained chat capacity is measured first (P50 TTFT <= 2 s, P99 TBT <= 0.25 s; a few
minutes, or give --capacity-qps), then a fresh daemon (its state in a temporary directory) takes
1.5x that for --duration-s, 20% of the clients going away after a few tokens, 10% of the requests
malformed or invalid (loadgen/soak_traffic.py), 3x bursts of 30 s every 5 minutes; normal clients give
up after --client-timeout-s. Recorded: status counts, 5xx and other server failures (must be 0), the
daemon's resident memory every 10 s (growth after the first --warmup-s must stay under 5%), KV usage
once drained (must be 0), the goodput of the accepted requests, whether a request right after the soak
is served normally, and that SIGTERM then ends the daemon with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench_common import MachineInfo, emit_summary  # noqa: I001 (benchmarks/ first on the path: see bench_common)
import results_file
from tuning_shift import start_daemon
from loadgen.bench_client import BenchOptions, live_probe, resolve_model_name
from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.soak_traffic import SoakPlan, outcome_counts, plan_requests, prompts_for, run_soak
from loadgen.workload import load_workload
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass

MAX_RSS_GROWTH = 0.05


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--capacity-qps", type=float, default=None, help="skip the capacity search: this is the capacity")
    p.add_argument("--overload", type=float, default=1.5, help="the base rate as a multiple of the capacity")
    p.add_argument("--burst-factor", type=float, default=3.0)
    p.add_argument("--burst-s", type=float, default=30.0)
    p.add_argument("--burst-every-s", type=float, default=300.0)
    p.add_argument("--disconnect-share", type=float, default=0.2)
    p.add_argument("--malformed-share", type=float, default=0.1)
    p.add_argument("--client-timeout-s", type=float, default=120.0)
    p.add_argument("--warmup-s", type=float, default=300.0, help="memory growth is judged after this")
    p.add_argument("--rss-every-s", type=float, default=10.0)
    p.add_argument("--drain-timeout-s", type=float, default=300.0)
    p.add_argument("--workload", default="chat")
    p.add_argument("--slo-ttft-s", type=float, default=2.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--capacity-requests", type=int, default=60, help="requests per capacity probe (at least "
                   "--capacity-min-duration-s of arrivals)")
    p.add_argument("--capacity-min-duration-s", type=float, default=120.0)
    p.add_argument("--capacity-start-qps", type=float, default=0.3)
    p.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                   help="a daemon setting (configs/default.yaml's keys), e.g. calibrate=false (repeatable)")
    p.add_argument("--port", type=int, default=8017)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


class RssSampler:
    """The daemon's resident memory (and its children's, the tuner's background processes) every `every_s`."""

    def __init__(self, pid: int, every_s: float) -> None:
        self.process, self.every_s, self.samples = psutil.Process(pid), every_s, []
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                children = sum(c.memory_info().rss for c in self.process.children(recursive=True))
                self.samples.append((round(time.monotonic() - self.start, 1), self.process.memory_info().rss, children))
            except psutil.Error:
                pass
            if self._stop.wait(self.every_s):
                return


def rss_growth(samples: list[tuple[float, int, int]], warmup_s: float, end_s: float) -> dict:
    """The median RSS over the minute after the warm-up against the median over the load's last minute
    (medians: one sample taken mid-burst does not decide), and the peak after the warm-up."""
    after = [(t, rss) for t, rss, _ in samples if warmup_s <= t <= end_s]
    if len(after) < 2:
        return {"judged": False, "reason": "too few samples after the warm-up"}
    base = statistics.median(rss for t, rss in after if t < warmup_s + 60)
    last = statistics.median(rss for t, rss in after if t >= end_s - 60)
    peak = max(rss for _, rss in after)
    return {"judged": True, "baseline_mib": round(base / 2 ** 20, 1), "final_mib": round(last / 2 ** 20, 1),
            "peak_mib": round(peak / 2 ** 20, 1), "growth": round(last / base - 1, 4),
            "peak_growth": round(peak / base - 1, 4), "ok": last / base - 1 < MAX_RSS_GROWTH}


def engine_gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    names = ("autotuned:num_requests_running", "autotuned:num_requests_waiting", "autotuned:kv_cache_usage_perc")
    return {f.name.removeprefix("autotuned:"): f.samples[0].value
            for f in text_string_to_metric_families(text) if f.name in names and f.samples}


def drain(url: str, timeout_s: float) -> dict:
    """Waits for no request running or waiting; the KV usage then (0: nothing leaked)."""
    start = time.monotonic()
    while True:
        gauges = engine_gauges(url)
        idle = not gauges["num_requests_running"] and not gauges["num_requests_waiting"]
        if idle or time.monotonic() - start > timeout_s:
            return {"drained": idle, "drain_s": round(time.monotonic() - start, 1), **gauges}
        time.sleep(1)


def request_after(url: str, model: str) -> dict:
    """One ordinary request once the soak is over: served normally, in full, in reasonable time."""
    start = time.monotonic()
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "The harbour town woke", "max_tokens": 16,
                                                  "ignore_eos": True, "temperature": 0.0}, timeout=60)
    body = r.json()
    usage, choice = body.get("usage") or {}, (body.get("choices") or [{}])[0]
    ok = r.status_code == 200 and usage.get("completion_tokens") == 16 and choice.get("finish_reason") == "length"
    return {"ok": ok, "status": r.status_code, "seconds": round(time.monotonic() - start, 2),
            "completion_tokens": usage.get("completion_tokens"), "health": httpx.get(url + "/health").status_code}


def measure_capacity(args, workload, source, options, slo) -> dict:
    probe = live_probe(workload, source, options, slo, args.capacity_requests, args.seed, args.capacity_min_duration_s)
    result = search_capacity(probe, CapacityCriteria(args.slo_ttft_s, args.slo_tbt_s), args.capacity_start_qps,
                             max_probes=5, tolerance=0.1)
    return {"capacity_qps": result.capacity_qps, "first_failing_qps": result.first_failing_qps,
            "probes": [(p.qps, p.passed) for p in result.probes]}


def settings(args, state_dir: str) -> dict:
    extra = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.setting)}
    return {"port": args.port, "state_dir": state_dir, "slo": {"ttft_s": args.slo_ttft_s, "tbt_s": args.slo_tbt_s}} | extra


def soak(args, workdir: str) -> dict:
    slo = SloClass(ttft_s=args.slo_ttft_s, tbt_s=args.slo_tbt_s)
    url = f"http://127.0.0.1:{args.port}"
    workload = load_workload(args.workload)
    source = PromptSource(load_prompt_tokenizer(None), args.seed)
    options = BenchOptions(url, progress=False, max_duration_s=args.duration_s + args.client_timeout_s + 60)
    proc = start_daemon(settings(args, os.path.join(workdir, "state")), workdir)
    try:
        model = resolve_model_name(options)
        capacity = ({"capacity_qps": args.capacity_qps, "given": True} if args.capacity_qps
                    else measure_capacity(args, workload, source, options, slo))
        if not capacity["capacity_qps"]:
            raise RuntimeError(f"no capacity measured: {capacity}")
        plan = SoakPlan(args.overload * capacity["capacity_qps"], args.duration_s, args.burst_factor, args.burst_s,
                        args.burst_every_s, args.disconnect_share, args.malformed_share, args.client_timeout_s,
                        seed=args.seed)
        requests = plan_requests(plan, workload)
        prompts = prompts_for(requests, source, options.sends_text)
        print(f"soak: {len(requests)} requests over {args.duration_s:.0f} s at {plan.rate_qps:.3f} req/s "
              f"(x{args.burst_factor:g} in bursts) against pid {proc.pid}", file=sys.stderr)
        with RssSampler(proc.pid, args.rss_every_s) as rss:
            outcomes, results, start = asyncio.run(run_soak(requests, prompts, options, model, plan))
            load_end_s = time.monotonic() - rss.start
            drained = drain(url, args.drain_timeout_s)
        after = request_after(url, model)
        alive = proc.poll() is None
        accepted = [r for r in results if r.status == 200]
        end = time.monotonic()
        goodput = summarize_requests([r.record(end) for r in accepted], slo, max(load_end_s, 1e-9)).as_dict()
        counts = outcome_counts(outcomes)
        memory = rss_growth(rss.samples, args.warmup_s, min(args.duration_s, load_end_s))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(timeout=120)
        except Exception:
            proc.kill()
            exit_code = proc.wait()
    log = open(os.path.join(workdir, "daemon.log")).read().splitlines()
    verdicts = {"no_server_failures": counts["server_failures"] == 0, "rss_growth_under_5pct": memory.get("ok"),
                "kv_zero_after_drain": drained["drained"] and drained["kv_cache_usage_perc"] == 0,
                "request_after_served": after["ok"], "alive_throughout": alive, "sigterm_exit_0": exit_code == 0}
    return {"plan": asdict(plan), "bursts": plan.bursts(), "capacity": capacity, "counts": counts,
            "goodput_of_accepted": {k: goodput[k] for k in ("num_requests", "num_finished", "goodput_rps",
                                                             "slo_attainment", "ttft_p50_s", "ttft_p99_s",
                                                             "tbt_p99_s", "request_throughput_rps")},
            "memory": memory, "rss_samples": rss.samples, "drain": drained, "request_after": after,
            "exit_code": exit_code, "daemon_log": {"lines": len(log), "errors": sum(" ERROR " in x for x in log),
                                                    "tracebacks": sum("Traceback" in x for x in log)},
            "verdicts": verdicts, "passed": all(verdicts.values())}


def main() -> None:
    args = parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)    # `kill -USR1 PID`: where a long soak is
    with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
        result = {"command": " ".join(["python", *sys.argv]), "machine": MachineInfo.collect().as_dict(),
                  **soak(args, workdir)}
        if args.json:       # the daemon's log beside the results, for whatever the verdicts point at
            shutil.copy(os.path.join(workdir, "daemon.log"), os.path.splitext(args.json)[0] + ".daemon.log")
    emit_summary({k: v for k, v in result.items() if k != "rss_samples"}, None)
    if args.json:
        results_file.write(args.json, result)     # + meta: machine, commit, date, command
    sys.exit(0 if result["passed"] else 1)


def render_doc(sources: list[Path]) -> str:
    """docs/deployment.md's soak figures of a results file (benchmarks/render_docs.py)."""
    r = results_file.read(sources[0])
    plan, counts, good, mem = r["plan"], r["counts"], r["goodput_of_accepted"], r["memory"]
    drained, after, log = r["drain"], r["request_after"], r["daemon_log"]
    status = ", ".join(f"{n} x {code}" for code, n in sorted(counts["status"].items()))
    kinds = ", ".join(f"{kind.replace('_', ' ')} " + ", ".join(f"{n} x {code}" for code, n in by_code.items())
                      for kind, by_code in counts["status_by_malformed"].items())
    capacity = r["capacity"]
    return "\n".join([
        f"- Load: {counts['requests']} requests over {plan['duration_s']:.0f} s at {plan['rate_qps']:.4g} req/s "
        f"({plan['rate_qps'] / capacity['capacity_qps']:.2g}x the capacity of {capacity['capacity_qps']:g} req/s, "
        f"{'given' if capacity.get('given') else 'measured'}), {plan['burst_factor']:g}x for {plan['burst_s']:.0f} s "
        f"every {plan['burst_every_s']:.0f} s; {plan['disconnect_share']:.0%} of clients leaving mid-stream, "
        f"{plan['malformed_share']:.0%} malformed or invalid.",
        f"- Status: {status}, **{counts['http_5xx']} x 5xx**, {counts['stream_errors']} stream errors, "
        f"{counts['transport_errors']} dropped connections; the daemon's log had {log['errors']} errors and "
        f"{log['tracebacks']} tracebacks. Each malformed kind: {kinds}.",
        f"- Memory: {mem['baseline_mib']:.1f} MiB after the warm-up, {mem['final_mib']:.1f} MiB at the end "
        f"(**{mem['growth']:+.1%}**, peak {mem['peak_growth']:+.1%}; bound 5%).",
        f"- After the drain: {drained['num_requests_running']:.0f} running, {drained['num_requests_waiting']:.0f} "
        f"waiting, **KV usage {drained['kv_cache_usage_perc']:g}**; a request right after the soak: "
        f"{after['status']}, {after['completion_tokens']} tokens in {after['seconds']:.2f} s, /health "
        f"{after['health']}; SIGTERM ended the daemon with **{r['exit_code']}**.",
        f"- Goodput of the accepted requests: {good['goodput_rps']:.2f} req/s within the SLO "
        f"({good['slo_attainment']:.0%} of them; P50 TTFT {good['ttft_p50_s']:.0f} s, P99 TBT "
        f"{good['tbt_p99_s']:.2f} s); {counts['client_timeouts']} normal clients hit their "
        f"{plan['client_timeout_s']:.0f} s timeout.",
        f"- Verdicts: " + ", ".join(f"{k.replace('_', ' ')} {'yes' if v else 'NO'}" for k, v in r["verdicts"].items())
        + f"; **{'passed' if r['passed'] else 'failed'}**.",
    ])


if __name__ == "__main__":
    main()
