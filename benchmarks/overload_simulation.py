"""Wall time of one simulated run over capacity, where the waiting queue grows to thousands: what the
capacity search's overloaded probes and a wrong start left alone cost the zero-config matrix
(benchmarks/zero_config.py). Prints the run's wall time, its steps and a digest of every request
record, so that the same command at two commits shows both the speed-up and that nothing served
changed.

    python benchmarks/overload_simulation.py --profile h100-llama3.1-8b --workload chat-system-prompt \
        --qps 128 --duration 40
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from engine.slo_class import SloClass
from loadgen.workload import generate, load_workload
from policies import Knobs
from simulation.cost_model_files import resolve_cost_model
from simulation.workload_run import simulate


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="h100-llama3.1-8b", help="a hardware profile")
    p.add_argument("--workload", default="chat-system-prompt")
    p.add_argument("--qps", type=float, default=128.0)
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    p.add_argument("--policy", default="deadline")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    specs = generate(load_workload(args.workload), qps=args.qps, duration_s=args.duration, seed=args.seed)
    cost = resolve_cost_model(profile=args.profile)
    start = time.perf_counter()
    run = simulate(specs, cost, args.policy, Knobs(), SloClass(ttft_s=2.0, tbt_s=0.1))
    wall = time.perf_counter() - start
    digest = hashlib.sha256(repr(run.records).encode()).hexdigest()[:16]
    print(json.dumps({"profile": args.profile, "workload": args.workload, "qps": args.qps, "requests": len(specs),
                      "policy": args.policy, "steps": run.num_steps, "ttft_p50_s": run.summary.ttft_p50_s,
                      "records_sha256": digest, "wall_s": round(wall, 2)}))


if __name__ == "__main__":
    main()
