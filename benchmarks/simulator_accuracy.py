"""How well the simulator predicts the real engine: the same requests through both, per policy.

For each policy, one seeded workload (a preset from configs/workloads.yaml at --qps) is replayed
open-loop in real time against the bundled SmolLM2 in this process (a request is added once its
arrival time has passed, with that arrival time; prompts are real text of the exact token length),
then simulated with the cost model. Reported: P50 TTFT and P99 TBT of both and their relative
error (target: within 15%), and the cost model's step-time MAPE on the real run's steps, which
the calibration never saw (target: <= 10%).

    python benchmarks/simulator_accuracy.py --cost-model state/cost_models/smollm2-135m-instruct-float32-cpu.json
    python benchmarks/simulator_accuracy.py --policies sarathi prefill-first --qps 1.0 --num-requests 120
"""

from __future__ import annotations

import argparse

from bench_common import MachineInfo, OtherLoad, emit_summary, replay_open_loop
from loadgen.prompts import PromptSource
from simulation.cost_model_files import find_cost_model
from simulation.workload_run import simulate
from loadgen.workload import RequestSpec, generate, load_workload
from engine import EngineConfig, LLMEngine
from simulation.cost_model import CostModel, StepShape
from engine.outputs import RequestRecord, StepRecord
from policies import Knobs
from telemetry.latency_summary import summarize_requests
from engine.slo_class import SloClass

KEYS = ("ttft_p50_s", "tbt_p99_s", "ttft_p99_s", "tbt_p50_s", "goodput_rps", "output_tokens_per_s")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", nargs="+", default=["sarathi", "prefill-first"])
    p.add_argument("--workload", default="chat")
    p.add_argument("--qps", type=float, default=1.0)
    p.add_argument("--num-requests", type=int, default=120)
    p.add_argument("--token-budget", type=int, default=128)
    p.add_argument("--cost-model", default=None, help="default: the state dir's newest, else the shipped one")
    p.add_argument("--state-dir", default="state")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def replay(engine: LLMEngine, specs: list[RequestSpec], prompts: PromptSource
           ) -> tuple[list[RequestRecord], list[StepRecord]]:
    """Open loop in real time: arrivals on schedule whatever the engine is doing."""
    return replay_open_loop(engine, specs, [prompts.token_ids(s.prompt_tokens) for s in specs])


def step_mape(cost: CostModel, steps: list[StepRecord]) -> float:
    return cost.mape([StepShape.of(s) for s in steps], [s.duration_s for s in steps])


def main() -> None:
    args = parse_args()
    engine = LLMEngine(EngineConfig())
    cost = find_cost_model(args.cost_model, args.state_dir)
    prompts = PromptSource(engine.tokenizer, args.seed)
    specs = generate(load_workload(args.workload), qps=args.qps, num_requests=args.num_requests, seed=args.seed)
    slo = SloClass()
    warm = [RequestSpec(0.0, 64, 8, "warm-up")] * 4
    replay(engine, warm, prompts)
    rows = []
    for policy in args.policies:
        knobs = Knobs(token_budget=args.token_budget)
        engine.set_policy(policy)
        engine.set_knobs(token_budget=args.token_budget)
        other = OtherLoad()
        records, steps = replay(engine, specs, prompts)
        span = max(r.finished for r in records) - min(r.arrival for r in records)
        real = summarize_requests(records, slo, span).as_dict()
        sim = simulate(specs, cost, policy, knobs, slo).summary.as_dict()
        error = {k: (sim[k] - real[k]) / real[k] for k in KEYS if real[k]}
        rows.append({"policy": policy, "real": {k: real[k] for k in KEYS}, "simulated": {k: sim[k] for k in KEYS},
                     "relative_error": error, "step_time_mape_on_real_steps": step_mape(cost, steps),
                     "real_steps": len(steps), "other_cpu_share": other.share()})
        print(f"{policy}: TTFT P50 real {real['ttft_p50_s']:.3f} s sim {sim['ttft_p50_s']:.3f} s "
              f"({100 * error['ttft_p50_s']:+.1f}%); TBT P99 real {real['tbt_p99_s']:.3f} s sim "
              f"{sim['tbt_p99_s']:.3f} s ({100 * error['tbt_p99_s']:+.1f}%); step MAPE "
              f"{100 * rows[-1]['step_time_mape_on_real_steps']:.1f}% over {len(steps)} real steps", flush=True)
    emit_summary({"machine": MachineInfo.collect().as_dict(), "workload": args.workload, "qps": args.qps,
                  "num_requests": args.num_requests, "token_budget": args.token_budget,
                  "cost_model": {"holdout_mape": cost.holdout_mape, "fit_mape": cost.fit_mape,
                                 "num_samples": cost.num_samples}, "policies": rows}, args.json)


if __name__ == "__main__":
    main()
