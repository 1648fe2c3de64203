"""The Sarathi-Serve ablation on the real engine: hybrid batching only (orca) vs chunked prefills
only (chunked-alternating) vs both (sarathi), next to prefill-first, prefill-priority and adaptive.

One seeded workload (Poisson arrivals at --rate, prompts of --prompt-len +- --prompt-jitter tokens
of English text, --output-min..--output-max output tokens with ignore_eos and temperature 0) is
replayed open-loop in real time against the bundled SmolLM2, once per policy, in one process: a
request is added once its arrival time has passed (with that arrival time), and the wall time of
every token a step returns is recorded. From these: TTFT (arrival -> first token), TBT (gaps
between consecutive tokens of one request), their P50/P99 over requests / over all gaps, and
throughput (output tokens / time from the first arrival to the last token).

All chunking policies get --token-budget. The policies that never chunk a prompt that fits
(prefill-first, orca) get --unchunked-budget, which defaults to the same value; setting it above
the longest prompt reproduces the paper's baselines, which have no per-step token limit.

    python benchmarks/policy_ablation.py
    python benchmarks/policy_ablation.py --rate 1.0 --num-requests 20 --policies orca sarathi
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from bench_common import emit_summary, MachineInfo, OtherLoad, build_prompts, wait_until_idle
from engine import EngineConfig, LLMEngine, SamplingParams
from policies import POLICIES, Knobs

DEFAULT_POLICIES = ["prefill-first", "orca", "chunked-alternating", "sarathi", "prefill-priority", "adaptive"]
UNCHUNKED = {"prefill-first", "orca", "request-level"}
ROLE = {"prefill-first": "prefill-first (vLLM v0)", "orca": "hybrid batching only",
        "chunked-alternating": "chunked prefills only", "sarathi": "hybrid + chunked"}


@dataclass(frozen=True)
class WorkItem:
    index: int
    arrival_s: float          # offset from the start of the run
    prompt: list[int]
    max_tokens: int


@dataclass
class Trace:
    """What the client saw of one request."""
    arrival: float            # time.monotonic()
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RunStats:
    policy: str
    token_budget: int
    requests: int
    ttft_p50_s: float
    ttft_p99_s: float
    tbt_p50_ms: float
    tbt_p99_ms: float
    tbt_max_ms: float
    output_tokens_per_s: float
    total_tokens_per_s: float  # prompt + output tokens / span
    span_s: float              # first arrival -> last token
    steps: int
    mean_step_ms: float
    preemptions: int
    other_cpu_share: float     # CPU used by other processes during the run (should be ~0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", nargs="+", default=DEFAULT_POLICIES, choices=list(POLICIES),
                   help=f"policies to run, in order (default {' '.join(DEFAULT_POLICIES)})")
    p.add_argument("--num-requests", type=int, default=48, help="requests in the workload (default 48)")
    p.add_argument("--rate", type=float, default=0.6, help="Poisson arrival rate, requests/s (default 0.6)")
    p.add_argument("--prompt-len", type=int, default=300, help="mean prompt tokens (default 300)")
    p.add_argument("--prompt-jitter", type=int, default=100, help="prompt length +- uniform (default 100)")
    p.add_argument("--output-min", type=int, default=64, help="fewest output tokens (default 64)")
    p.add_argument("--output-max", type=int, default=128, help="most output tokens (default 128)")
    p.add_argument("--token-budget", type=int, default=512, help="token budget per step (default 512)")
    p.add_argument("--unchunked-budget", type=int, default=None,
                   help="token budget for prefill-first and orca (default: --token-budget)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument("--dtype", default="auto", help="engine dtype: auto (default), fp32 or bf16")
    p.add_argument("--wait-idle", type=float, default=60.0,
                   help="before each run, wait up to this many seconds for an idle CPU (default 60)")
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    return p.parse_args()


def make_workload(encode, args: argparse.Namespace) -> list[WorkItem]:
    rng = random.Random(args.seed)
    prompts = build_prompts(encode, args.num_requests, args.prompt_len, args.prompt_jitter, args.seed)
    items, t = [], 0.0
    for i, prompt in enumerate(prompts):
        items.append(WorkItem(i, t, prompt, rng.randint(args.output_min, args.output_max)))
        t += rng.expovariate(args.rate)
    return items


def drive(engine: LLMEngine, workload: list[WorkItem], tag: str) -> tuple[dict[str, Trace], int]:
    """Replay the workload open-loop in real time; returns client-side traces and the step count."""
    pending = deque(workload)
    traces: dict[str, Trace] = {}
    steps = 0
    start = time.monotonic()
    while pending or engine.has_unfinished():
        now = time.monotonic()
        while pending and start + pending[0].arrival_s <= now:
            item = pending.popleft()
            arrival = start + item.arrival_s
            params = SamplingParams(max_tokens=item.max_tokens, temperature=0.0, ignore_eos=True)
            rid = engine.add_request(item.prompt, params, request_id=f"{tag}-{item.index}", arrival_time=arrival)
            traces[rid] = Trace(arrival)
        if not engine.has_unfinished():
            time.sleep(max(0.0, start + pending[0].arrival_s - time.monotonic()))
            continue
        outputs = engine.step()
        steps += 1
        now = time.monotonic()
        for out in outputs:
            traces[out.request_id].token_times.extend([now] * len(out.new_token_ids))
    return traces, steps


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1])."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered)) - 1))]


def summarize(policy: str, budget: int, traces: dict[str, Trace], workload: list[WorkItem], steps: int,
              elapsed_s: float, preemptions: int, other: float) -> RunStats:
    ttfts = [t.token_times[0] - t.arrival for t in traces.values()]
    gaps = [b - a for t in traces.values() for a, b in zip(t.token_times, t.token_times[1:])]
    first = min(t.arrival for t in traces.values())
    span = max(t.token_times[-1] for t in traces.values()) - first
    out_tokens = sum(len(t.token_times) for t in traces.values())
    prompt_tokens = sum(len(w.prompt) for w in workload)
    return RunStats(policy, budget, len(traces), statistics.median(ttfts), percentile(ttfts, 0.99),
                    1000 * statistics.median(gaps), 1000 * percentile(gaps, 0.99), 1000 * max(gaps),
                    out_tokens / span, (out_tokens + prompt_tokens) / span, span, steps,
                    1000 * elapsed_s / steps, preemptions, other)


def run_policy(engine: LLMEngine, policy: str, budget: int, workload: list[WorkItem]) -> RunStats:
    engine.set_policy(policy)
    engine.set_knobs(token_budget=budget)
    preempted = engine.scheduler.num_preemptions
    other = OtherLoad()
    t0 = time.monotonic()
    traces, steps = drive(engine, workload, policy)
    elapsed = time.monotonic() - t0
    expected = {f"{policy}-{w.index}": w.max_tokens for w in workload}
    got = {rid: len(t.token_times) for rid, t in traces.items()}
    if got != expected:
        raise AssertionError(f"{policy}: token counts differ from max_tokens for "
                             f"{[r for r in expected if got.get(r) != expected[r]][:5]}")
    return summarize(policy, budget, traces, workload, steps, elapsed,
                     engine.scheduler.num_preemptions - preempted, other.share())


def warm_up(engine: LLMEngine, workload: list[WorkItem]) -> None:
    """A few requests through the engine at once, so no policy pays for first-call costs."""
    for item in workload[:4]:
        engine.add_request(item.prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()


def print_table(stats: list[RunStats]) -> None:
    print(f"\n{'policy':<21}{'role':<24}{'budget':>7}{'TTFT p50':>9}{'p99 s':>7}{'TBT p50':>9}{'p99':>7}"
          f"{'max ms':>8}{'out tok/s':>10}{'steps':>7}{'preempt':>8}{'other cpu':>10}")
    for s in stats:
        print(f"{s.policy:<21}{ROLE.get(s.policy, ''):<24}{s.token_budget:>7}{s.ttft_p50_s:>9.2f}"
              f"{s.ttft_p99_s:>7.2f}{s.tbt_p50_ms:>9.0f}{s.tbt_p99_ms:>7.0f}{s.tbt_max_ms:>8.0f}"
              f"{s.output_tokens_per_s:>10.1f}{s.steps:>7}{s.preemptions:>8}{100 * s.other_cpu_share:>9.0f}%")


def main() -> None:
    args = parse_args()
    unchunked_budget = args.unchunked_budget or args.token_budget
    top = max(args.token_budget, unchunked_budget)
    engine = LLMEngine(EngineConfig(dtype=args.dtype, knobs=Knobs(token_budget=top), max_token_budget=max(8192, top)))
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    workload = make_workload(engine.tokenizer.encode, args)
    lengths = [len(w.prompt) for w in workload]
    print(f"engine dtype {dtype}; {len(workload)} requests over {workload[-1].arrival_s:.0f} s "
          f"(rate {args.rate}/s), prompts {min(lengths)}-{max(lengths)} tokens, "
          f"outputs {args.output_min}-{args.output_max}; KV pool {engine.block_manager.num_blocks} blocks", flush=True)
    warm_up(engine, workload)
    stats = []
    for policy in args.policies:
        wait_until_idle(args.wait_idle)
        budget = unchunked_budget if policy in UNCHUNKED else args.token_budget
        stats.append(run_policy(engine, policy, budget, workload))
        s = stats[-1]
        print(f"{policy}: TTFT p50 {s.ttft_p50_s:.2f} s, TBT p99 {s.tbt_p99_ms:.0f} ms, span {s.span_s:.0f} s, "
              f"other processes {100 * s.other_cpu_share:.0f}% of the CPU", flush=True)
    print_table(stats)
    summary = {"machine": MachineInfo.collect().as_dict(), "dtype": dtype,
               "workload": {k: getattr(args, k) for k in ("num_requests", "rate", "prompt_len", "prompt_jitter",
                                                          "output_min", "output_max", "seed")},
               "token_budget": args.token_budget, "unchunked_budget": unchunked_budget,
               "results": [asdict(s) for s in stats]}
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
