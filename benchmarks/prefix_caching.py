"""Automatic prefix caching, on against off, side by side in one run (docs/prefix_caching.md).

1. Live: the bundled SmolLM2 (fp32, CPU) in this process, two engines (prefix caching on and off),
   each workload's seeded requests replayed open-loop in real time (a request is added once its
   arrival time has passed; prompts are real token ids, a prefix group's shared tokens the same for
   every request of the group, as `autotuned-serve bench` sends them), the two engines in turn per
   workload. The policy is the daemon's default (deadline, token cap 2048) pricing steps with the
   shipped cost model. Reported per workload and engine: TTFT P50/P99, TBT P99, the cache's hit
   rate, prompt tokens computed, and step time: for the plain `chat` workload the mean duration of
   decode-only steps of equal batch size on both engines (the bookkeeping a cache adds, with the
   work held equal) and mean scheduling time per step.
2. Bookkeeping (model-free): the scheduler and block pool alone stepping `chat` requests (no
   shared prefix) as the engine would, caching on and off alternately in rounds; the microseconds
   per step that caching adds, next to the live step time (what a step costs on top of this).
3. Simulated capacity (the live daemon would need hours of probes on 2 cores): the largest rate
   with P50 TTFT <= 2 s and P99 TBT <= 0.25 s, by the capacity search over the simulator of the
   real scheduler and block pool with the engine's cost model, caching on and off.
4. Live bracket, two probes instead of a search: caching off at `--bracket-qps` / 1.5 and on at
   `--bracket-qps`, each with the capacity criterion above. Off failing and on passing proves the
   live capacity ratio is at least 1.5x (off's capacity is below the lower rate, on's at least the
   higher one); any other outcome says it was not shown.

Steps are priced, as in the daemon, by the cost model that describes this engine (its weights path
included: the GGUF's quantized weights by default) and run with that calibration's crossover.

    .venv/bin/python benchmarks/prefix_caching.py --sections capacity bookkeeping --json docs/results/prefix_caching.json
    .venv/bin/python benchmarks/prefix_caching.py --sections bookkeeping
    .venv/bin/python benchmarks/prefix_caching.py --sections bracket --workloads chat-system-prompt --bracket-qps 0.24
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench_common import MachineInfo, OtherLoad, emit_summary, replay_open_loop
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.outputs import RequestRecord, StepRecord
from engine.slo_class import SloClass, shipped_slo_classes
from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.prompts import PromptSource
from loadgen.workload import RequestSpec, generate, load_workload
from policies import Knobs
from simulation.cost_model import CostModel
from simulation.cost_model_files import SHIPPED_COST_MODEL
from simulation.live_cost_model import LiveCostModel
from simulation.simulator import Simulator
from simulation.startup_cost_model import choose_cost_model
from telemetry.latency_summary import summarize_requests

POLICY, KNOBS = "deadline", Knobs(token_budget=2048)   # the daemon's defaults (serving/settings.py)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["chat-system-prompt", "multi-turn", "chat"])
    p.add_argument("--qps", type=float, default=0.25, help="live replay rate (default 0.25 req/s)")
    p.add_argument("--num-requests", type=int, default=24, help="live requests per workload and engine")
    p.add_argument("--capacity-requests", type=int, default=300, help="simulated requests per capacity probe")
    p.add_argument("--sections", nargs="+", default=["capacity", "bookkeeping", "live"],
                   choices=["capacity", "bookkeeping", "live", "bracket"])
    p.add_argument("--bracket-qps", type=float, default=0.3,
                   help="the bracket's rate with caching on; off runs at a third less (default 0.3 req/s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def make_engines() -> tuple[dict[bool, LLMEngine], CostModel]:
    """Caching on and off, each pricing its steps with the cost model the daemon would choose for it
    (no calibration at start: the shipped one that describes this engine, else the dense fit)."""
    engines = {caching: LLMEngine(EngineConfig(dtype="fp32", policy=POLICY, knobs=KNOBS,
                                               enable_prefix_caching=caching)) for caching in (True, False)}
    with tempfile.TemporaryDirectory() as state_dir:
        choices = {caching: choose_cost_model(e, state_dir, calibrate_at_start=False) for caching, e in engines.items()}
    for caching, engine in engines.items():
        # as the daemon: the deadline policy prices steps with it, kept to the live machine's speed
        LiveCostModel(choices[caching].model, choices[caching].source).attach(engine)
        engine.scheduler.arrival_guard_s = shipped_slo_classes().arrival_guard_s()
    print(f"cost model: {choices[True].source}", flush=True)
    return engines, choices[True].model


def replay(engine: LLMEngine, specs: list[RequestSpec], prompts: list[list[int]]
           ) -> tuple[list[RequestRecord], list[StepRecord]]:
    """Open loop in real time: arrivals on schedule whatever the engine is doing."""
    return replay_open_loop(engine, specs, prompts)


def decode_step_times(steps: list[StepRecord]) -> dict[int, list[float]]:
    """Durations of decode-only steps by batch size: equal work on both engines."""
    out: dict[int, list[float]] = defaultdict(list)
    for s in steps:
        if s.num_prefill_tokens == 0:
            out[s.num_decode_tokens].append(s.duration_s)
    return out


def live_row(records: list[RequestRecord], steps: list[StepRecord], other: float) -> dict:
    span = max(r.finished for r in records) - min(r.arrival for r in records)
    summary = summarize_requests(records, SloClass(), span).as_dict()
    queries = sum(s.prefix_cache_queries for s in steps)
    return {"ttft_p50_s": summary["ttft_p50_s"], "ttft_p99_s": summary["ttft_p99_s"],
            "tbt_p99_s": summary["tbt_p99_s"], "num_requests": summary["num_requests"],
            "num_finished": summary["num_finished"],
            "hit_rate": sum(s.prefix_cache_hits for s in steps) / queries if queries else None,
            "prompt_tokens": sum(r.num_prompt_tokens for r in records),
            "prefill_tokens_computed": sum(s.num_prefill_tokens for s in steps),
            "steps": len(steps), "step_time_mean_s": statistics.fmean(s.duration_s for s in steps),
            "schedule_time_mean_s": statistics.fmean(s.schedule_s for s in steps), "other_cpu_share": other}


def matched_decode_ratio(on: list[StepRecord], off: list[StepRecord]) -> dict:
    """Mean decode-only step time with caching over without, at each batch size both ran, weighted
    by the smaller count."""
    a, b = decode_step_times(on), decode_step_times(off)
    sizes = sorted(set(a) & set(b))
    weights = {n: min(len(a[n]), len(b[n])) for n in sizes}
    on_mean = sum(weights[n] * statistics.fmean(a[n]) for n in sizes)
    off_mean = sum(weights[n] * statistics.fmean(b[n]) for n in sizes)
    return {"batch_sizes": sizes, "steps_compared": sum(weights.values()),
            "on_over_off": on_mean / off_mean if off_mean else None}


def warm_up(engines: dict[bool, LLMEngine], source: PromptSource) -> None:
    warm = [RequestSpec(0.0, 64, 8, "warm-up")] * 4
    for engine in engines.values():
        replay(engine, warm, [source.token_ids(64) for _ in warm])


def workload_requests(name: str, qps: float, args: argparse.Namespace, source: PromptSource
                      ) -> tuple[list[RequestSpec], list[list[int]]]:
    """The workload's seeded requests and their prompt token ids (a prefix group's shared the same)."""
    specs = generate(load_workload(name), qps=qps, num_requests=args.num_requests, seed=args.seed)
    return specs, [source.prompt_ids(s.prompt_tokens, s.prefix_group, s.prefix_tokens) for s in specs]


def live(args: argparse.Namespace, engines: dict[bool, LLMEngine]) -> list[dict]:
    source = PromptSource(engines[True].tokenizer, args.seed)
    warm_up(engines, source)
    rows = []
    for name in args.workloads:
        specs, prompts = workload_requests(name, args.qps, args, source)
        row: dict = {"workload": name}
        steps = {}
        for caching in (False, True):
            other = OtherLoad()
            records, steps[caching] = replay(engines[caching], specs, prompts)
            row["on" if caching else "off"] = live_row(records, steps[caching], other.share())
        row["ttft_p50_on_over_off"] = row["on"]["ttft_p50_s"] / row["off"]["ttft_p50_s"]
        row["decode_step_time"] = matched_decode_ratio(steps[True], steps[False])
        rows.append(row)
        print_live(row)
    return rows


def print_live(row: dict) -> None:
    on, off, d = row["on"], row["off"], row["decode_step_time"]
    ratio = f"{d['on_over_off']:.3f}" if d["on_over_off"] else "n/a"
    print(f"{row['workload']}: TTFT P50 {on['ttft_p50_s']:.3f} s on vs {off['ttft_p50_s']:.3f} s off "
          f"({row['ttft_p50_on_over_off']:.2f}x); hit rate {on['hit_rate'] or 0:.2f}; prefill computed "
          f"{on['prefill_tokens_computed']} vs {off['prefill_tokens_computed']} tokens; decode-only step time "
          f"on/off {ratio} over {d['steps_compared']} steps; schedule {1e3 * on['schedule_time_mean_s']:.2f} vs "
          f"{1e3 * off['schedule_time_mean_s']:.2f} ms/step; other CPU load {on['other_cpu_share']:.2f}/"
          f"{off['other_cpu_share']:.2f}", flush=True)


def bracket(args: argparse.Namespace, engines: dict[bool, LLMEngine]) -> list[dict]:
    source = PromptSource(engines[True].tokenizer, args.seed)
    warm_up(engines, source)
    criteria, rows = CapacityCriteria(), []
    for name in args.workloads:
        row: dict = {"workload": name}
        for caching, qps in ((False, args.bracket_qps / 1.5), (True, args.bracket_qps)):
            specs, prompts = workload_requests(name, qps, args, source)
            other = OtherLoad()
            records, steps = replay(engines[caching], specs, prompts)
            stats = live_row(records, steps, other.share())
            row["on" if caching else "off"] = {"qps": qps, "meets_slo": criteria.passes(stats), **stats}
        row["capacity_ratio_at_least_1_5"] = row["on"]["meets_slo"] and not row["off"]["meets_slo"]
        on, off = row["on"], row["off"]
        print(f"{name}: off at {off['qps']:.3f} req/s {'meets' if off['meets_slo'] else 'misses'} the SLO "
              f"(TTFT P50 {off['ttft_p50_s']:.2f} s, TBT P99 {off['tbt_p99_s']:.3f} s); on at {on['qps']:.3f} "
              f"{'meets' if on['meets_slo'] else 'misses'} it (TTFT P50 {on['ttft_p50_s']:.2f} s, TBT P99 "
              f"{on['tbt_p99_s']:.3f} s); capacity on/off >= 1.5x shown: {row['capacity_ratio_at_least_1_5']}",
              flush=True)
        rows.append(row)
    return rows


def simulated_capacity(name: str, caching: bool, cost: CostModel, n: int, seed: int) -> dict:
    workload = load_workload(name)

    def probe(qps: float):
        specs = generate(workload, qps=qps, num_requests=n, seed=seed)
        sim = Simulator(cost, cost.kv_blocks, cost.block_size, POLICY, KNOBS, prefix_caching=caching)
        records: list[RequestRecord] = []
        sim.finish_listeners.append(records.append)
        sim.submit(specs)
        sim.run()
        return summarize_requests(records, SloClass(), max(sim.now - specs[0].arrival_s, 1e-9))

    result = search_capacity(probe, CapacityCriteria(), start_qps=0.2, max_probes=10, tolerance=0.03)
    return {"capacity_qps": result.capacity_qps, "first_failing_qps": result.first_failing_qps,
            "probes": len(result.probes)}


def capacity(args: argparse.Namespace, cost: CostModel) -> list[dict]:
    rows = []
    for name in args.workloads:
        on = simulated_capacity(name, True, cost, args.capacity_requests, args.seed)
        off = simulated_capacity(name, False, cost, args.capacity_requests, args.seed)
        ratio = on["capacity_qps"] / off["capacity_qps"] if off["capacity_qps"] else None
        rows.append({"workload": name, "on": on, "off": off, "on_over_off": ratio})
        print(f"{name}: simulated capacity {on['capacity_qps']:.3f} req/s on vs {off['capacity_qps']:.3f} off "
              f"({ratio:.2f}x)" if ratio else f"{name}: no passing rate without caching", flush=True)
    return rows


def bookkeeping(seed: int, rounds: int = 5, num_requests: int = 200) -> dict:
    """schedule() + commit() time per step over the same chat requests, caching on and off in turn."""
    specs = generate(load_workload("chat"), qps=1.0, num_requests=num_requests, seed=seed)
    source = PromptSource(_CountingTokenizer(), seed)
    prompts = [source.token_ids(s.prompt_tokens) for s in specs]
    per_step: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for caching in (False, True):
            per_step[caching].append(_bookkeeping_run(specs, prompts, caching))
    on, off = statistics.median(per_step[True]), statistics.median(per_step[False])
    print(f"bookkeeping: {1e6 * on:.1f} us/step with caching vs {1e6 * off:.1f} us without "
          f"(+{1e6 * (on - off):.1f} us per step)", flush=True)
    return {"on_s_per_step": on, "off_s_per_step": off, "added_s_per_step": on - off, "rounds": rounds}


class _CountingTokenizer:
    """Token ids for PromptSource without loading a model: one per character of its text."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def _bookkeeping_run(specs: list[RequestSpec], prompts: list[list[int]], caching: bool) -> float:
    from engine.kv_cache.block_manager import BlockManager
    from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
    from engine.scheduling.request import FinishReason, Request
    from engine.scheduling.scheduler import Scheduler

    cost = CostModel.load(SHIPPED_COST_MODEL)
    pool = (PrefixCachingBlockManager if caching else BlockManager)(cost.kv_blocks, cost.block_size)
    sched = Scheduler(pool, "sarathi", Knobs(token_budget=256))
    for i, (spec, ids) in enumerate(zip(specs, prompts)):
        sched.add(Request(f"r{i}", ids, SamplingParams(max_tokens=spec.output_tokens), 0.0))
    steps, start = 0, time.perf_counter()
    while sched.has_work():
        result = sched.schedule()
        sched.commit(result)
        for s in result.scheduled:
            if s.samples:
                s.request.output_token_ids.append(1)
                if s.request.num_output_tokens >= s.request.max_tokens:
                    sched.finish(s.request, FinishReason.LENGTH)
        steps += 1
    return (time.perf_counter() - start) / steps


def main() -> None:
    args = parse_args()
    engines, cost = make_engines()
    summary = {"machine": MachineInfo.collect().as_dict(), "policy": POLICY, "token_budget": KNOBS.token_budget,
               "cost_model": {"weights": cost.weights, "kernel_max_rows": cost.kernel_max_rows},
               "qps": args.qps, "num_requests": args.num_requests, "seed": args.seed,
               "capacity": capacity(args, cost) if "capacity" in args.sections else None,
               "bookkeeping": bookkeeping(args.seed) if "bookkeeping" in args.sections else None,
               "live": live(args, engines) if "live" in args.sections else None,
               "bracket": bracket(args, engines) if "bracket" in args.sections else None}
    emit_summary(summary, args.json)


def render_doc(sources: list[Path]) -> str:
    """docs/prefix_caching.md's simulated capacity table and bookkeeping line of a results file
    written with `--sections capacity bookkeeping` (benchmarks/render_docs.py)."""
    r = json.loads(Path(sources[0]).read_text())
    cost, lines = r["cost_model"], []
    if r.get("capacity"):
        lines += [f"Simulated, {r['policy']} policy (token cap {r['token_budget']}), steps priced with the cost model "
                  f"of the {cost['weights']} weights path (seed {r['seed']}):", "",
                  "| workload | caching on (req/s) | off (req/s) | on / off |", "| --- | --- | --- | --- |"]
        for row in r["capacity"]:
            ratio = row["on_over_off"]
            lines.append(f"| {row['workload']} | {row['on']['capacity_qps']:.3f} | {row['off']['capacity_qps']:.3f} | "
                         + (f"**{ratio:.2f}x** |" if ratio and round(ratio, 2) != 1 else
                            f"{ratio:.2f}x |" if ratio else "- |"))
    b = r.get("bookkeeping")
    if b:
        lines += ["" if lines else None, f"Bookkeeping, model-free (median of {b['rounds']} rounds, "
                  f"{r['machine']['cpu_model']}, {r['machine']['nproc']} cores, 1-minute load average "
                  f"{r['machine']['load_avg_1m']:.1f}): {1e3 * b['on_s_per_step']:.2f} ms a step with caching against "
                  f"{1e3 * b['off_s_per_step']:.2f} ms without, **{1e3 * b['added_s_per_step']:.2f} ms added**."]
    return "\n".join(x for x in lines if x is not None)


if __name__ == "__main__":
    main()
