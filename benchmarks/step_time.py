"""Step time of the engine, split into model forward and the Python work around it.

Decode: for each batch size, `B` requests with ~`--context` tokens of prompt are prefilled, then
`--steps` pure decode steps are timed. Prefill: prompts of `--prefill-prompt-len` tokens are
computed in chunks of `--chunk` tokens (the token budget), one chunk per step; steps are reported
by how much of the prompt is already cached (a later chunk also attends to the earlier ones).

Each step is read from engine.last_record (a StepRecord). Two step times are reported:
  record  StepRecord.duration_s (schedule + prepare + forward + sample)
  wall    the whole engine.step() call, which also appends tokens and detokenizes
Python work = wall - forward_s: scheduling, input preparation, sampling and output processing.

    python benchmarks/step_time.py
    python benchmarks/step_time.py --batch-sizes 1 8 --steps 5 --prefill-requests 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from bench_common import (MachineInfo, OtherLoad, add_contention_args, build_prompts, emit_summary,
                          retry_contended)
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.outputs import StepRecord
from policies import Knobs


@dataclass(frozen=True)
class StepStats:
    kind: str                 # "decode" or "prefill"
    batch: int                # sequences per step (decode) or tokens per step (prefill)
    context: int              # tokens already cached per sequence before the step (median)
    steps: int
    wall_s: float             # medians over the timed steps from here on
    record_s: float
    schedule_s: float
    prepare_s: float
    forward_s: float
    sample_s: float
    output_s: float           # wall - record: appending tokens, detokenizing, building outputs
    python_s: float           # wall - forward
    python_share: float       # python_s / wall_s
    tokens_per_s: float       # tokens computed per step / wall
    other_cpu_share: float    # CPU other processes used during the timed steps (should be ~0)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64],
                   help="decode batch sizes (default 1 8 32 64)")
    p.add_argument("--context", type=int, default=200, help="prompt tokens per decode sequence (default 200)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement (default 20)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed decode steps first (default 3)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk = token budget (default 512)")
    p.add_argument("--prefill-prompt-len", type=int, default=2048,
                   help="prompt length for the prefill measurement; a multiple of --chunk gives "
                        "pure full chunks (default 2048)")
    p.add_argument("--prefill-requests", type=int, default=6,
                   help="prompts prefilled; the first is a warm-up (default 6: 5 timed chunks per context)")
    p.add_argument("--dtype", default="auto", help="engine dtype: auto (default), fp32 or bf16")
    add_contention_args(p)
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    args = p.parse_args()
    if args.prefill_requests < 2:
        p.error("--prefill-requests must be at least 2: the first prompt is an untimed warm-up")
    return args


def median(values: list[float]) -> float:
    return statistics.median(values)


def summarize(kind: str, batch: int, steps: list[tuple[float, StepRecord]], other: float) -> StepStats:
    walls = [w for w, _ in steps]
    records = [r for _, r in steps]
    wall, forward = median(walls), median([r.forward_s for r in records])
    python = median([w - r.forward_s for w, r in steps])
    tokens = median([r.num_prefill_tokens + r.num_decode_tokens for r in records])
    context = median([(r.context_tokens - r.num_prefill_tokens - r.num_decode_tokens)
                      / (r.num_decode_tokens + r.num_prefill_seqs) for r in records])
    return StepStats(kind, batch, round(context), len(steps), wall, median([r.duration_s for r in records]),
                     median([r.schedule_s for r in records]), median([r.prepare_s for r in records]), forward,
                     median([r.sample_s for r in records]), median([w - r.duration_s for w, r in steps]),
                     python, median([(w - r.forward_s) / w for w, r in steps]), tokens / wall, other)


def timed_step(engine: LLMEngine) -> tuple[float, StepRecord]:
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start, engine.last_record


def abort_all(engine: LLMEngine) -> None:
    for request_id in list(engine.requests):
        engine.abort(request_id)


def decode_tokens(engine: LLMEngine, prompts: list[list[int]], batch: int, steps: int, warmup: int) -> int:
    """Enough max_tokens that no request finishes before the timed steps end: the first requests
    start decoding while later ones are still prefilling."""
    prefill_steps = -(-sum(len(p) for p in prompts[:batch]) // engine.scheduler.knobs.token_budget)
    return prefill_steps + warmup + steps + 8


def measure_decode(engine: LLMEngine, prompts: list[list[int]], batch: int, steps: int, warmup: int) -> StepStats:
    params = SamplingParams(max_tokens=decode_tokens(engine, prompts, batch, steps, warmup),
                            temperature=0.0, ignore_eos=True)
    for prompt in prompts[:batch]:
        engine.add_request(prompt, params)
    while True:  # prefill until every sequence decodes
        engine.step()
        if engine.last_record.num_prefill_tokens == 0 and engine.last_record.num_decode_tokens == batch:
            break
    for _ in range(warmup):
        engine.step()
    other = OtherLoad()
    timed = [timed_step(engine) for _ in range(steps)]
    other_share = other.share()
    bad = [(r.num_decode_tokens, r.num_prefill_tokens, r.num_running, r.num_preempted) for _, r in timed
           if r.num_decode_tokens != batch or r.num_prefill_tokens]
    assert not bad, bad
    abort_all(engine)
    return summarize("decode", batch, timed, other_share)


def measure_prefill(engine: LLMEngine, prompts: list[list[int]], chunk: int) -> list[StepStats]:
    """One chunk per step; the first prompt's chunks are a warm-up. One result per cached context."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    for prompt in prompts:
        engine.add_request(prompt, params)
    first_len = len(prompts[0])
    timed, computed, other = [], 0, OtherLoad()
    while engine.has_unfinished():
        wall, record = timed_step(engine)
        computed += record.num_prefill_tokens
        if computed > first_len and record.num_prefill_tokens == chunk and record.num_decode_tokens == 0:
            timed.append((wall, record))
    share = other.share()
    by_context: dict[int, list[tuple[float, StepRecord]]] = {}
    for wall, record in timed:
        by_context.setdefault(record.context_tokens - chunk, []).append((wall, record))
    return [summarize("prefill", chunk, steps, share) for _, steps in sorted(by_context.items())]


def print_table(stats: list[StepStats]) -> None:
    head = (f"{'step':<14}{'ctx':>6}{'wall ms':>9}{'record':>8}{'sched':>7}{'prep':>7}{'fwd':>8}{'sample':>8}"
            f"{'output':>8}{'python':>8}{'py %':>7}{'tok/s':>9}{'other cpu':>11}")
    print("\n" + head)
    for s in stats:
        ms = lambda x: f"{1000 * x:.1f}"  # noqa: E731
        print(f"{s.kind + ' ' + str(s.batch):<14}{s.context:>6}{ms(s.wall_s):>9}{ms(s.record_s):>8}{ms(s.schedule_s):>7}"
              f"{ms(s.prepare_s):>7}{ms(s.forward_s):>8}{ms(s.sample_s):>8}{ms(s.output_s):>8}"
              f"{ms(s.python_s):>8}{100 * s.python_share:>6.1f}%{s.tokens_per_s:>9.1f}"
              f"{100 * s.other_cpu_share:>10.0f}%")


def main() -> None:
    args = parse_args()
    max_batch = max(args.batch_sizes)
    prefill_steps = -(-max_batch * args.context // max(args.chunk, max_batch))
    decode_len = args.context + prefill_steps + args.warmup_steps + args.steps + 8 + 16
    blocks = max(max_batch * -(-decode_len // 16), args.prefill_requests * -(-args.prefill_prompt_len // 16)) + 16
    config = EngineConfig(dtype=args.dtype, num_kv_blocks=blocks, block_size=16,
                          knobs=Knobs(token_budget=max(args.chunk, max_batch), max_num_seqs=max(256, max_batch)))
    engine = LLMEngine(config)
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    print(f"engine dtype ({args.dtype}): {dtype}")
    encode = engine.tokenizer.encode
    prompts = build_prompts(encode, max_batch, args.context, 0)

    measure_decode(engine, prompts, min(8, max_batch), 3, 2)  # warm-up, discarded
    contention = (args.wait_idle, args.max_other_cpu, args.retries)
    stats = [retry_contended(partial(measure_decode, engine, prompts, batch, args.steps, args.warmup_steps),
                             *contention) for batch in args.batch_sizes]
    engine.set_knobs(token_budget=args.chunk)
    long_prompts = build_prompts(encode, args.prefill_requests, args.prefill_prompt_len, 0, seed=1)
    stats += retry_contended(partial(measure_prefill, engine, long_prompts, args.chunk), *contention,
                             share=lambda results: results[0].other_cpu_share)

    print_table(stats)
    summary = {"machine": MachineInfo.collect().as_dict(), "dtype": dtype, "context": args.context,
               "steps": args.steps, "results": [asdict(s) for s in stats]}
    by_batch = {s.batch: s for s in stats if s.kind == "decode"}
    if 32 in by_batch:
        share = by_batch[32].python_share
        summary["python_share_batch32"] = share
        print(f"\nPython work at decode batch 32: {100 * share:.1f}% of the step (target < 10%)")
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
