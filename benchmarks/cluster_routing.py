"""Routing quality of the cluster (issue #19): prefix-affinity routing against round-robin, two
replicas of the bundled model on a local Ray cluster, and the router's own cost per request.

For each workload and routing policy a fresh Serve application is started (so every run begins
with cold prefix caches and zeroed counters), the workload's seeded requests are replayed open-loop
through the ingress with the bench client (prompts as token ids, a prefix group's shared tokens the
same in every request), and the application is deleted. Reported per run: TTFT P50/P99, the
replicas' prefix-cache hit rate (prompt tokens found cached over prompt tokens looked up, summed
over replicas from the ingress's /metrics), requests per replica, and the router's overhead per
request (ingress time before the request is sent to its replica: body, tokenizing, block hashing,
choosing; P50/P99 from /cluster/replicas).

Outputs are capped (--max-output-tokens) so a run fits a small CPU; each replica gets one torch
thread, no tuner and no start-up calibration.

    nice -n 19 .venv/bin/python benchmarks/cluster_routing.py --num-requests 24 --qps 0.5 --json OUT.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_common import MachineInfo, emit_summary  # noqa: E402
from loadgen.bench_client import BenchOptions, make_prompts, run_bench  # noqa: E402
from loadgen.prompts import PromptSource, load_prompt_tokenizer  # noqa: E402
from loadgen.workload import generate, load_workload  # noqa: E402
from engine.slo_class import SloClass  # noqa: E402

APP = "routing-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["chat-system-prompt", "multi-turn"])
    p.add_argument("--policies", nargs="+", default=["affinity", "round_robin"],
                   choices=["affinity", "load", "round_robin"])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--num-requests", type=int, default=24, help="requests per run (default 24)")
    p.add_argument("--qps", type=float, default=0.5, help="arrival rate (default 0.5 req/s)")
    p.add_argument("--max-output-tokens", type=int, default=16, help="outputs capped to this (default 16)")
    p.add_argument("--kv-cache-memory-mb", type=float, default=128.0, help="KV pool per replica (default 128)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def start_app(policy: str, args: argparse.Namespace, state_dir: str, url: str) -> None:
    from ray import serve

    from cluster.app import cluster_app
    from cluster.cluster_spec import ClusterSpec
    from cluster.router import RouterConfig

    spec = ClusterSpec(replicas=args.replicas, state_dir=state_dir, torch_threads=1, replica_cpus=1,
                       router=RouterConfig(policy=policy),
                       settings={"tune": False, "calibrate": False, "kv_cache_memory_mb": args.kv_cache_memory_mb})
    serve.run(cluster_app(spec), name=APP, route_prefix="/")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            view = httpx.get(url + "/cluster/replicas", timeout=5).json()["replicas"]
            if all(r["healthy"] for r in view.values()):
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise RuntimeError("the replicas did not become healthy")


def cache_counts(url: str) -> dict[str, dict[str, float]]:
    """Per replica, from the ingress's /metrics: prefix-cache queries and hits (tokens), finished
    requests, and the router's decisions by reason."""
    counts: dict[str, dict[str, float]] = {}
    wanted = {"autotuned:prefix_cache_queries_total": "queries", "autotuned:prefix_cache_hits_total": "hits",
              "autotuned:request_success_total": "requests", "autotuned:router_decisions_total": "routed"}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0]
        if name in wanted and 'replica="' in line:
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            entry = counts.setdefault(replica, dict.fromkeys(wanted.values(), 0.0))
            key = wanted[name]
            if key == "routed":
                key = "routed_" + line.split('reason="', 1)[1].split('"', 1)[0]
            entry[key] = entry.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def one_run(workload_name: str, policy: str, args: argparse.Namespace, url: str, source: PromptSource) -> dict:
    from ray import serve

    workload = load_workload(workload_name)
    specs = [dataclasses.replace(s, output_tokens=min(s.output_tokens, args.max_output_tokens))
             for s in generate(workload, args.qps, args.num_requests, None, args.seed)]
    prompts = make_prompts(specs, source, text=False)
    with tempfile.TemporaryDirectory() as state_dir:
        start_app(policy, args, state_dir, url)
        try:
            load_before = os.getloadavg()[0]
            options = BenchOptions(url, None, False, "completions", None, 1800.0, False)
            run = run_bench(specs, prompts, options, SloClass())
            counts = cache_counts(url)
            overhead = httpx.get(url + "/cluster/replicas", timeout=5).json()["overhead_s"]
        finally:
            serve.delete(APP)
    queries = sum(c["queries"] for c in counts.values())
    summary = run.summary.as_dict()
    return {"workload": workload_name, "policy": policy, "requests": len(specs),
            "failed": sum(not r.ok for r in run.results),
            "ttft_p50_s": summary["ttft_p50_s"], "ttft_p99_s": summary["ttft_p99_s"],
            "prefix_cache_hit_rate": sum(c["hits"] for c in counts.values()) / queries if queries else None,
            "requests_per_replica": {r: c["requests"] for r, c in sorted(counts.items())},
            "routed_by_reason": {r: {k.removeprefix("routed_"): v for k, v in c.items() if k.startswith("routed_")}
                                 for r, c in sorted(counts.items())},
            "router_overhead_p50_ms": 1000 * overhead["p50"], "router_overhead_p99_ms": 1000 * overhead["p99"],
            "router_overhead_samples": overhead["count"], "load_avg_1m_before": load_before}


def main() -> None:
    args = parse_args()
    import ray
    from ray import serve

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    source = PromptSource(load_prompt_tokenizer(None), args.seed)
    ray.init(address="local", num_cpus=args.replicas + 2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    rows = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for workload in args.workloads:
            for policy in args.policies:
                row = one_run(workload, policy, args, url, source)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"\n{'workload':<20} {'policy':<12} {'hit rate':>8} {'TTFT P50':>9} {'TTFT P99':>9} "
          f"{'router P50':>10} {'router P99':>10}  per replica")
    for r in rows:
        hit = f"{r['prefix_cache_hit_rate']:.2f}" if r["prefix_cache_hit_rate"] is not None else "-"
        print(f"{r['workload']:<20} {r['policy']:<12} {hit:>8} {r['ttft_p50_s']:>8.2f}s {r['ttft_p99_s']:>8.2f}s "
              f"{r['router_overhead_p50_ms']:>8.2f}ms {r['router_overhead_p99_ms']:>8.2f}ms  "
              f"{r['requests_per_replica']}")
    emit_summary({"machine": MachineInfo.collect().as_dict(), "settings": vars(args), "runs": rows}, args.json)


if __name__ == "__main__":
    main()
