"""Step time of the engine, split into model forward and the Python work around it.

Decode: for each batch size, `B` requests with ~`--context` tokens of prompt are prefilled, then
`--steps` pure decode steps are timed. Prefill: for each `--chunk`, prompts of `--prefill-prompt-len`
tokens are computed in chunks of that many tokens (the token budget), one chunk per step; steps are
reported by how much of the prompt is already cached (a later chunk also attends to the earlier ones).

Each step is read from engine.last_record (a StepRecord). Two step times are reported:
  record  StepRecord.duration_s (schedule + prepare + forward + sample)
  wall    the whole engine.step() call, which also appends tokens and detokenizes
Python work = wall - forward_s: scheduling, input preparation, sampling and output processing.

MBU and MFU: the engine's own telemetry model (telemetry/model_cost.py: the bytes and FLOPs of each
StepRecord) over the step's wall time, against the device's peaks (--peak-flops/--peak-bandwidth, or
a hardware profile's spec-sheet figures); the median over the timed steps. --torch-profile N runs N
more steps per measurement under torch.profiler: on CUDA, the device time of its kernels per step and
the MBU over that time (kernel_mbu), a check of the telemetry's figure and of how busy the GPU is.

    python benchmarks/step_time.py
    python benchmarks/step_time.py --batch-sizes 1 8 --steps 5 --prefill-requests 2
    python benchmarks/step_time.py --model tiny --device cpu --batch-sizes 1 8 --steps 3 --prefill-requests 2 \\
        --chunk 64 --prefill-prompt-len 128

On a lent H100 (Llama-3.1-8B's shape with random weights, no download; then again without CUDA graphs):

    python benchmarks/step_time.py --model llama-3.1-8b --device cuda --dtype bf16 --batch-sizes 1 8 32 64 128 \\
        --chunk 512 2048 --hardware-profile h100-llama3.1-8b --torch-profile 5 --wait-idle 10 --json OUT.json
    python benchmarks/step_time.py --model llama-3.1-8b --device cuda --dtype bf16 --batch-sizes 1 8 32 64 128 \\
        --chunk 512 2048 --hardware-profile h100-llama3.1-8b --torch-profile 5 --wait-idle 10 --no-cuda-graphs \\
        --json OUT-eager.json

The --json file is rewritten after every measurement (complete: false until the end); a measurement
that fails is listed under "errors" and the others go on (exit status 1).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import logging
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, Callable

import results_file
from bench_common import (MachineInfo, OtherLoad, add_contention_args, build_prompts, emit_summary,
                          retry_contended)
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.outputs import StepRecord
from policies import Knobs
from simulation.hardware_profile import load_profile
from simulation.machine import machine_fingerprint
from telemetry.model_cost import ModelCost

STEP_MARK = "step_time.step"     # the record_function range around each profiled step
SALTS = itertools.count()        # a cache salt per request: a re-run prompt must not hit the prefix cache


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
    mbu: float | None = None  # ModelCost.step_bytes / wall / peak bandwidth (None: no peak given)
    mfu: float | None = None  # ModelCost.step_flops / wall / peak FLOP/s
    profiled_steps: int = 0   # --torch-profile: steps run under torch.profiler (not among the timed ones)
    kernel_s: float | None = None         # device time of kernels and copies per profiled step (None on CPU)
    kernels_per_step: float | None = None  # device events per profiled step (a handful: a graph's kernels untraced)
    kernel_mbu: float | None = None       # ModelCost.step_bytes / kernel_s / peak bandwidth


@dataclass(frozen=True)
class Peaks:
    """The device's peak FLOP/s and memory bandwidth; either None where unknown (its MFU or MBU then is)."""

    flops_per_s: float | None
    bytes_per_s: float | None
    source: str               # "flags", "profile NAME", "flags and profile NAME" or "none"


@dataclass(frozen=True)
class Meter:
    """What every measurement is priced and profiled with."""

    cost: ModelCost
    peaks: Peaks
    device: str
    profile_steps: int = 0    # --torch-profile

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class Profiled:
    record: StepRecord
    device_s: float | None    # kernels and copies of the step on the GPU; None without CUDA
    device_events: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="default: the bundled model; a preset (tiny, llama-3.1-8b, ...: random weights of its "
                        "shape), a .gguf file or an HF directory")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--dtype", default="auto", help="engine dtype: auto (default), fp32 or bf16")
    p.add_argument("--no-cuda-graphs", action="store_true", help="on CUDA: run every step eagerly")
    p.add_argument("--max-model-len", type=int, default=None, help="default: the model's own, capped by the engine")
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help="KV pool in blocks of 16 tokens (default: what the measurements need on the CPU, "
                        "what gpu_memory_utilization leaves on a GPU)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64],
                   help="decode batch sizes (default 1 8 32 64)")
    p.add_argument("--context", type=int, default=200, help="prompt tokens per decode sequence (default 200)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement (default 20)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed decode steps first (default 3)")
    p.add_argument("--chunk", type=int, nargs="+", default=[512],
                   help="prefill chunks = token budgets, one prefill measurement each (default 512)")
    p.add_argument("--prefill-prompt-len", type=int, default=2048,
                   help="prompt length for the prefill measurement; a multiple of every --chunk gives "
                        "pure full chunks (default 2048)")
    p.add_argument("--prefill-requests", type=int, default=6,
                   help="prompts prefilled; the first is a warm-up (default 6: 5 timed chunks per context)")
    p.add_argument("--peak-flops", type=float, default=None, help="the device's peak FLOP/s, for MFU (e.g. 989e12)")
    p.add_argument("--peak-bandwidth", type=float, default=None,
                   help="the device's peak memory bytes/s, for MBU (e.g. 3.35e12)")
    p.add_argument("--hardware-profile", default=None,
                   help="configs/hardware_profiles/NAME.yaml: the peaks not given by the two flags above "
                        "(spec sheet; the bf16 dense peak for FLOP/s)")
    p.add_argument("--torch-profile", type=int, default=0, metavar="N",
                   help="per measurement, N more steps under torch.profiler: the kernels' device time per "
                        "step and the MBU over it (default 0: none)")
    add_contention_args(p)
    p.add_argument("--json", default=None, help="also write the JSON summary to this file (after every measurement)")
    args = p.parse_args(argv)
    if args.prefill_requests < 2:
        p.error("--prefill-requests must be at least 2: the first prompt is an untimed warm-up")
    if min(args.chunk) < 1 or min(args.batch_sizes) < 1 or args.steps < 1 or args.torch_profile < 0:
        p.error("--chunk, --batch-sizes and --steps must be >= 1, --torch-profile >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: CUDA is not available on this machine")
    return args


def median(values: list[float]) -> float:
    return statistics.median(values)


def resolve_peaks(args: argparse.Namespace) -> Peaks:
    """Each peak from its flag, else from --hardware-profile (TFLOP/s and TB/s), else None."""
    flops, bandwidth = args.peak_flops, args.peak_bandwidth
    flagged = flops is not None or bandwidth is not None
    if args.hardware_profile and (flops is None or bandwidth is None):
        hardware = load_profile(args.hardware_profile).hardware
        flops = hardware.peak_tflops * 1e12 if flops is None else flops
        bandwidth = hardware.hbm_tbs * 1e12 if bandwidth is None else bandwidth
        source = f"flags and profile {args.hardware_profile}" if flagged else f"profile {args.hardware_profile}"
        return Peaks(flops, bandwidth, source)
    return Peaks(flops, bandwidth, "flags" if flagged else "none")


def utilisation(rates: list[float], peak: float | None) -> float | None:
    return median(rates) / peak if peak and rates else None


def summarize(kind: str, batch: int, steps: list[tuple[float, StepRecord]], other: float, meter: Meter) -> StepStats:
    walls = [w for w, _ in steps]
    records = [r for _, r in steps]
    wall, forward = median(walls), median([r.forward_s for r in records])
    python = median([w - r.forward_s for w, r in steps])
    tokens = median([r.num_prefill_tokens + r.num_decode_tokens for r in records])
    context = median([(r.context_tokens - r.num_prefill_tokens - r.num_decode_tokens)
                      / (r.num_decode_tokens + r.num_prefill_seqs) for r in records])
    cost, peaks = meter.cost, meter.peaks
    mbu = utilisation([cost.step_bytes(r) / w for w, r in steps], peaks.bytes_per_s)
    mfu = utilisation([cost.step_flops(r) / w for w, r in steps], peaks.flops_per_s)
    return StepStats(kind, batch, round(context), len(steps), wall, median([r.duration_s for r in records]),
                     median([r.schedule_s for r in records]), median([r.prepare_s for r in records]), forward,
                     median([r.sample_s for r in records]), median([w - r.duration_s for w, r in steps]),
                     python, median([(w - r.forward_s) / w for w, r in steps]), tokens / wall, other, mbu, mfu)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed_step(engine: LLMEngine, device: str) -> tuple[float, StepRecord]:
    start = time.perf_counter()
    engine.step()
    # the step already ends synchronized (the forward syncs, the sampled tokens come to the host); this
    # keeps the clock honest should a step ever return before its kernels finish
    sync(device)
    return time.perf_counter() - start, engine.last_record


def abort_all(engine: LLMEngine) -> None:
    for request_id in list(engine.requests):
        engine.abort(request_id)


def add_prompts(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> None:
    for prompt in prompts:
        engine.add_request(prompt, params, cache_salt=f"step-time-{next(SALTS)}")


def self_device_us(event: Any) -> float:
    """An event's own device time: self_device_time_total (torch >= 2.4), self_cuda_time_total before."""
    value = getattr(event, "self_device_time_total", None)
    return value if value is not None else event.self_cuda_time_total


def device_time_per_step(events: list[Any], mark: str = STEP_MARK) -> list[tuple[float, int]]:
    """(device seconds, device events) of each `mark` range of a profile, in order. A device event (kernel,
    copy, memset) counts for the last range that began before it: it is launched within its step, and the
    step ends synchronized, so none runs into the next. User annotations on the GPU timeline are not work."""
    from torch.autograd import DeviceType

    starts = sorted(e.time_range.start for e in events if e.name == mark and e.device_type == DeviceType.CPU)
    totals = [[0.0, 0] for _ in starts]
    for e in events:
        if e.device_type == DeviceType.CPU or e.name == mark or getattr(e, "is_user_annotation", False):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i >= 0:
            totals[i][0] += self_device_us(e) / 1e6
            totals[i][1] += 1
    return [(s, n) for s, n in totals]


def profile_steps(engine: LLMEngine, meter: Meter, count: int | None) -> list[Profiled]:
    """`count` steps (None: until no request is left) under torch.profiler, each in a STEP_MARK range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if meter.cuda else [])
    records: list[StepRecord] = []
    sync(meter.device)
    with profile(activities=activities) as prof:
        while engine.has_unfinished() and (count is None or len(records) < count):
            with record_function(STEP_MARK):
                engine.step()
            records.append(engine.last_record)
    if not meter.cuda:
        return [Profiled(r, None, 0) for r in records]
    per_step = device_time_per_step(prof.events())
    if len(per_step) != len(records):
        raise RuntimeError(f"the profile holds {len(per_step)} step ranges for {len(records)} steps")
    return [Profiled(r, s, n) for r, (s, n) in zip(records, per_step)]


def try_profile(engine: LLMEngine, meter: Meter, count: int | None) -> list[Profiled]:
    """profile_steps, or nothing where the profiler fails (no CUPTI, say): it is a check, not the measurement."""
    try:
        return profile_steps(engine, meter, count)
    except Exception as e:  # noqa: BLE001
        print(f"torch.profiler failed, no kernel times for this measurement: {type(e).__name__}: {e}", flush=True)
        return []


def with_profile(stats: StepStats, profiled: list[Profiled], meter: Meter) -> StepStats:
    stats = replace(stats, profiled_steps=len(profiled))
    timed = [p for p in profiled if p.device_s is not None]
    device_s = sum(p.device_s for p in timed)
    if not timed or device_s <= 0:
        return stats
    peak = meter.peaks.bytes_per_s
    kernel_mbu = sum(meter.cost.step_bytes(p.record) for p in timed) / device_s / peak if peak else None
    return replace(stats, kernel_s=device_s / len(timed), kernel_mbu=kernel_mbu,
                   kernels_per_step=sum(p.device_events for p in timed) / len(timed))


def decode_tokens(engine: LLMEngine, prompts: list[list[int]], batch: int, steps: int, warmup: int) -> int:
    """Enough max_tokens that no request finishes before the timed steps end: the first requests
    start decoding while later ones are still prefilling."""
    prefill_steps = -(-sum(len(p) for p in prompts[:batch]) // engine.scheduler.knobs.token_budget)
    # x4: the deadline policy may cut the budget's steps smaller to keep the running decodes' TBT
    return 4 * prefill_steps + warmup + steps + 8


def is_pure_decode(record: StepRecord, batch: int) -> bool:
    return record.num_decode_tokens == batch and not record.num_prefill_tokens


def measure_decode(engine: LLMEngine, prompts: list[list[int]], batch: int, steps: int, warmup: int,
                   meter: Meter) -> StepStats:
    params = SamplingParams(max_tokens=decode_tokens(engine, prompts, batch, steps + meter.profile_steps, warmup),
                            temperature=0.0, ignore_eos=True)
    add_prompts(engine, prompts[:batch], params)
    while True:  # prefill until every sequence decodes
        engine.step()
        if is_pure_decode(engine.last_record, batch):
            break
    for _ in range(warmup):
        engine.step()
    sync(meter.device)
    other = OtherLoad()
    timed = [timed_step(engine, meter.device) for _ in range(steps)]
    other_share = other.share()
    bad = [(r.num_decode_tokens, r.num_prefill_tokens, r.num_running, r.num_preempted) for _, r in timed
           if not is_pure_decode(r, batch)]
    assert not bad, bad
    stats = summarize("decode", batch, timed, other_share, meter)
    if meter.profile_steps:
        profiled = try_profile(engine, meter, meter.profile_steps)
        stats = with_profile(stats, [p for p in profiled if is_pure_decode(p.record, batch)], meter)
    abort_all(engine)
    return stats


def is_full_chunk(record: StepRecord, chunk: int) -> bool:
    """One prompt's chunk of `chunk` tokens alone (not a prompt's tail packed with the next one's head)."""
    return record.num_prefill_tokens == chunk and record.num_prefill_seqs == 1 and record.num_decode_tokens == 0


def measure_prefill(engine: LLMEngine, prompts: list[list[int]], chunk: int, meter: Meter) -> list[StepStats]:
    """One chunk per step; the first prompt's chunks are a warm-up. One result per cached context.
    With --torch-profile N, N of the prompts are then prefilled again under the profiler."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    add_prompts(engine, prompts, params)
    first_len = len(prompts[0])
    timed, computed, other = [], 0, OtherLoad()
    sync(meter.device)
    while engine.has_unfinished():
        wall, record = timed_step(engine, meter.device)
        computed += record.num_prefill_tokens
        if computed > first_len and is_full_chunk(record, chunk):
            timed.append((wall, record))
    share = other.share()
    by_context: dict[int, list[tuple[float, StepRecord]]] = {}
    for wall, record in timed:
        by_context.setdefault(record.context_tokens - chunk, []).append((wall, record))
    stats = {context: summarize("prefill", chunk, steps, share, meter) for context, steps in by_context.items()}
    if meter.profile_steps:
        add_prompts(engine, [prompts[i % len(prompts)] for i in range(meter.profile_steps)], params)
        profiled: dict[int, list[Profiled]] = {}
        for p in try_profile(engine, meter, None):
            if is_full_chunk(p.record, chunk):
                profiled.setdefault(p.record.context_tokens - chunk, []).append(p)
        stats = {c: with_profile(s, profiled.get(c, []), meter) for c, s in stats.items()}
        abort_all(engine)
    if not stats:
        raise RuntimeError(f"no full {chunk}-token chunk was timed: is --prefill-prompt-len at least --chunk?")
    return [stats[c] for c in sorted(stats)]


def fmt_pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def print_table(stats: list[StepStats]) -> None:
    head = (f"{'step':<14}{'ctx':>6}{'wall ms':>9}{'record':>8}{'sched':>7}{'prep':>7}{'fwd':>8}{'sample':>8}"
            f"{'output':>8}{'python':>8}{'py %':>7}{'tok/s':>9}{'other cpu':>11}{'MBU %':>7}{'MFU %':>7}"
            f"{'kern ms':>9}{'kMBU %':>8}")
    print("\n" + head)
    for s in stats:
        ms = lambda x: "-" if x is None else f"{1000 * x:.1f}"  # noqa: E731
        print(f"{s.kind + ' ' + str(s.batch):<14}{s.context:>6}{ms(s.wall_s):>9}{ms(s.record_s):>8}{ms(s.schedule_s):>7}"
              f"{ms(s.prepare_s):>7}{ms(s.forward_s):>8}{ms(s.sample_s):>8}{ms(s.output_s):>8}"
              f"{ms(s.python_s):>8}{100 * s.python_share:>6.1f}%{s.tokens_per_s:>9.1f}"
              f"{100 * s.other_cpu_share:>10.0f}%{fmt_pct(s.mbu):>7}{fmt_pct(s.mfu):>7}"
              f"{ms(s.kernel_s):>9}{fmt_pct(s.kernel_mbu):>8}")


def kv_blocks_needed(args: argparse.Namespace) -> int:
    """Blocks for the largest decode batch to its last token, or for the prefill prompts, whichever is more."""
    max_batch = max(args.batch_sizes)
    prefill_steps = 4 * -(-max_batch * args.context // max(max(args.chunk), max_batch))
    decode_len = args.context + prefill_steps + args.warmup_steps + args.steps + args.torch_profile + 8 + 16
    prompts = max(args.prefill_requests, args.torch_profile)
    return max(max_batch * -(-decode_len // 16), prompts * -(-args.prefill_prompt_len // 16)) + 16


def build_engine(args: argparse.Namespace) -> LLMEngine:
    max_batch, top_chunk = max(args.batch_sizes), max(args.chunk)
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, block_size=16,
                          # on a GPU, unless given: the pool gpu_memory_utilization leaves (the daemon's)
                          num_kv_blocks=args.num_kv_blocks or (None if args.device.startswith("cuda")
                                                               else kv_blocks_needed(args)),
                          max_model_len=args.max_model_len, cuda_graphs=not args.no_cuda_graphs,
                          max_token_budget=max(8192, top_chunk, max_batch),
                          knobs=Knobs(token_budget=max(top_chunk, max_batch), max_num_seqs=max(256, max_batch)))
    return LLMEngine(config)


def device_info(engine: LLMEngine, args: argparse.Namespace) -> dict[str, Any]:
    cuda = args.device.startswith("cuda")
    return {"device": args.device, "device_description": machine_fingerprint(args.device),
            "gpu_name": torch.cuda.get_device_name(torch.device(args.device).index or 0) if cuda else None,
            "torch_cuda": torch.version.cuda if cuda else None,
            "cuda_graphs_captured": getattr(engine.runner, "decode_graphs", None) is not None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    started = time.monotonic()
    engine = build_engine(args)
    dtype = str(engine.runner.dtype).removeprefix("torch.")
    peaks = resolve_peaks(args)
    meter = Meter(ModelCost.of_engine(engine), peaks, args.device, args.torch_profile)
    info = device_info(engine, args)
    print(f"engine: {engine.model_config.name} {dtype} ({args.dtype}) on {info['device_description']}, "
          f"{engine.block_manager.num_blocks} KV blocks, max_model_len {engine.max_model_len}, CUDA graphs "
          f"{info['cuda_graphs_captured']}; built in {time.monotonic() - started:.1f} s; peaks: {peaks}", flush=True)
    summary: dict[str, Any] = {
        "machine": MachineInfo.collect().as_dict(), **info, "model": engine.model_config.name, "dtype": dtype,
        "cuda_graphs_requested": not args.no_cuda_graphs, "max_model_len": engine.max_model_len,
        "num_kv_blocks": engine.block_manager.num_blocks, "context": args.context, "steps": args.steps,
        "chunks": args.chunk, "prefill_prompt_len": args.prefill_prompt_len, "torch_profile_steps": args.torch_profile,
        "hardware_profile": args.hardware_profile, "peaks": asdict(peaks), "complete": False, "errors": [],
        "results": []}
    stats: list[StepStats] = []

    def run(label: str, measurement: Callable[[], StepStats | list[StepStats]]) -> None:
        start = time.monotonic()
        try:
            out = measurement()
        except Exception as e:  # noqa: BLE001  (one failed measurement must not lose the others: GPU time is short)
            traceback.print_exc()
            summary["errors"].append(f"{label}: {type(e).__name__}: {e}")
            abort_all(engine)
            return
        stats.extend(out if isinstance(out, list) else [out])
        summary["results"] = [asdict(s) for s in stats]
        print(f"{label}: {time.monotonic() - start:.1f} s", flush=True)
        if args.json:
            results_file.write(args.json, summary)

    encode = engine.tokenizer.encode
    max_batch = max(args.batch_sizes)
    prompts = build_prompts(encode, max_batch, args.context, 0)

    def warm_up() -> list[StepStats]:   # compiles and first-touches; its figures are discarded
        measure_decode(engine, prompts, min(8, max_batch), 3, 2, replace(meter, profile_steps=0))
        return []

    run("warm-up", warm_up)
    contention = (args.wait_idle, args.max_other_cpu, args.retries)
    for batch in args.batch_sizes:
        run(f"decode {batch}", partial(retry_contended, partial(measure_decode, engine, prompts, batch, args.steps,
                                                                 args.warmup_steps, meter), *contention))
    long_prompts = build_prompts(encode, args.prefill_requests, args.prefill_prompt_len, 0, seed=1)
    for chunk in args.chunk:
        engine.set_knobs(token_budget=chunk)
        run(f"prefill {chunk}", partial(retry_contended, partial(measure_prefill, engine, long_prompts, chunk, meter),
                                        *contention, share=lambda results: results[0].other_cpu_share))

    print_table(stats)
    by_batch = {s.batch: s for s in stats if s.kind == "decode"}
    if 32 in by_batch:
        share = by_batch[32].python_share
        summary["python_share_batch32"] = share
        print(f"\nPython work at decode batch 32: {100 * share:.1f}% of the step (target < 10%)")
    summary |= {"complete": True, "total_s": round(time.monotonic() - started, 1)}
    emit_summary(summary, args.json)
    for error in summary["errors"]:
        print(f"FAILED {error}", file=sys.stderr)
    return summary


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)



def render_doc(sources: list) -> str:
    """docs/gpu.md's table: the same steps with CUDA graphs (sources[0], with the profiler's kernel time) and
    without (sources[1]), measured in one call on one machine."""
    graphs, eager = (results_file.read(s) for s in sources)
    eager_by_step = {_step_key(r): r for r in eager["results"]}
    lines = [f"{graphs['model']} ({graphs['dtype']}) on {graphs['gpu_name']}, {graphs['num_kv_blocks']} KV blocks; "
             f"peaks from {graphs['peaks']['source']}; medians of {graphs['steps']} steps (graphs) and "
             f"{eager['steps']} (eager).", "",
             "| step | context | graphs ms | eager ms | eager / graphs | MBU % | MFU % | kernel ms | kernel MBU % |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in graphs["results"]:
        e = eager_by_step.get(_step_key(r))
        eager_ms = "-" if e is None else f"{1e3 * e['wall_s']:.1f}"
        ratio = "-" if e is None else f"{e['wall_s'] / r['wall_s']:.2f}x"
        lines.append(f"| {r['kind']} {r['batch']} | {r['context']} | {1e3 * r['wall_s']:.1f} | {eager_ms} | {ratio} | "
                     f"{_pct(r['mbu'])} | {_pct(r['mfu'])} | {_ms(r['kernel_s'])} | {_pct(r['kernel_mbu'])} |")
    return "\n".join(lines)


def _step_key(result: dict) -> tuple:
    """Decodes by batch (their context drifts by a few tokens between runs), prefill chunks by cached context too."""
    return result["kind"], result["batch"], result["context"] if result["kind"] == "prefill" else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"
