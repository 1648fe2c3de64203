"""The CPU facts behind the engine's dtype and kernel choices (docs/benchmarking.md, docs/design/engine.md):

  matmul   GFLOP/s of fp32 and bf16 matmuls: a square one (--square, 1024^3) and SmolLM2-135M's
           linear layers (fused QKV, O, fused gate/up, down) at 1, 64 and 512 rows, the LM head at 1
  int8     int8 instead of fp32 on the bundled SmolLM2: dynamic quantization (torch.ao, per-tensor
           activations) of every linear layer, and of the LM head alone: decode/prefill forward time
           and how many greedy tokens match fp32's before the first difference; and
           torch._weight_int8pack_mm (int8 weights, per-channel scales) against an fp32 matmul
  profile  the model's FLOPs per token; torch.profiler over decode steps at batch 32 (~200 tokens
           of context each): each op's share of the self CPU time; and the model FLOP rate of
           512-token prefill chunks

    python benchmarks/cpu_kernels.py
    python benchmarks/cpu_kernels.py --only matmul --json out/cpu_kernels.json
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

from bench_common import MachineInfo, OtherLoad, add_contention_args, build_prompts, emit_summary, wait_until_idle
import torch  # after bench_common, which imports the engine first (OpenMP wait policy)
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.outputs import StepRecord
from policies import Knobs
from telemetry.model_cost import ModelCost
from telemetry.model_shape import ModelShape

SECTIONS = ("matmul", "int8", "profile")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument("--seconds", type=float, default=0.5, help="timing per matmul point (default 0.5)")
    p.add_argument("--square", type=int, default=1024, help="side of the square matmul (default 1024)")
    p.add_argument("--int8-prompts", type=int, default=8, help="greedy prompts compared with fp32 (default 8)")
    p.add_argument("--int8-tokens", type=int, default=48, help="greedy tokens per prompt (default 48)")
    p.add_argument("--profile-steps", type=int, default=5, help="decode steps profiled (default 5)")
    add_contention_args(p)
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    return p.parse_args()


# ---- matmuls -------------------------------------------------------------------------------------

def best_time(run, seconds: float) -> float:
    """Best of repeated runs over `seconds` (at least 3) after a warm-up; a run slower than `seconds`
    (bf16 without bf16 units) is timed twice, the warm-up included."""
    start = time.perf_counter()
    run()
    best = time.perf_counter() - start
    runs, deadline = 0, time.perf_counter() + seconds
    while runs < (1 if best > seconds else 3) or (best <= seconds and time.perf_counter() < deadline):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, seconds: float) -> float:
    """(m x k) @ (k x n) in GFLOP/s, at its best time."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / best_time(lambda: a @ b, seconds) / 1e9


def smollm2_linears() -> dict[str, tuple[int, int]]:
    """(in, out) features of SmolLM2-135M's linear layers (hidden 576, MLP 1536, 9 heads / 3 KV heads
    of 64, vocab 49152), as the engine fuses them."""
    return {"qkv": (576, 576 + 2 * 192), "o": (576, 576), "gate_up": (576, 2 * 1536), "down": (1536, 576),
            "lm_head": (576, 49152)}


def run_matmul(seconds: float, square: int) -> dict:
    other = OtherLoad()
    rows = []
    points = [(f"square {square}", square, square, square)]
    points += [(name, m, k, n) for name, (k, n) in smollm2_linears().items()
               for m in ((1,) if name == "lm_head" else (1, 64, 512))]
    for name, m, k, n in points:
        fp32 = matmul_gflops(m, k, n, torch.float32, seconds)
        bf16 = matmul_gflops(m, k, n, torch.bfloat16, seconds)
        rows.append({"shape": name, "m": m, "k": k, "n": n, "fp32_gflops": fp32, "bf16_gflops": bf16,
                     "fp32_over_bf16": fp32 / bf16})
    print(f"\n{'matmul':<14}{'m x k x n':>20}{'fp32 GFLOP/s':>14}{'bf16 GFLOP/s':>14}{'fp32/bf16':>11}")
    for r in rows:
        dims = f"{r['m']} x {r['k']} x {r['n']}"
        print(f"{r['shape']:<14}{dims:>20}{r['fp32_gflops']:>14.1f}"
              f"{r['bf16_gflops']:>14.1f}{r['fp32_over_bf16']:>10.1f}x")
    model = [r for r in rows if not r["shape"].startswith("square")]
    return {"points": rows, "other_cpu_share": other.share(),
            "model_fp32_gflops_range": [min(r["fp32_gflops"] for r in model), max(r["fp32_gflops"] for r in model)],
            "model_fp32_over_bf16_range": [min(r["fp32_over_bf16"] for r in model),
                                           max(r["fp32_over_bf16"] for r in model)]}


# ---- int8 ----------------------------------------------------------------------------------------

def engine(budget: int = 512, blocks: int = 2048) -> LLMEngine:
    return LLMEngine(EngineConfig(dtype="fp32", num_kv_blocks=blocks, block_size=16,
                                  knobs=Knobs(token_budget=budget, max_num_seqs=256)))


def greedy(e: LLMEngine, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], list[StepRecord]]:
    """Every prompt at once, greedy; the outputs in prompt order and each step's record."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [e.add_request(p, params) for p in prompts]
    outputs, records = {}, []
    while e.has_unfinished():
        for out in e.step():
            if out.finished:
                outputs[out.request_id] = out.token_ids
        records.append(e.last_record)
    return [outputs[i] for i in ids], records


def forward_ms(records: list[StepRecord], batch: int) -> tuple[float, float]:
    """Median forward time (ms) of the all-decode steps at full batch and of the prefill steps."""
    decode = [r.forward_s for r in records if not r.num_prefill_tokens and r.num_decode_tokens == batch]
    prefill = [r.forward_s for r in records if r.num_prefill_tokens]
    return 1000 * statistics.median(decode), 1000 * statistics.median(prefill)


def matching_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def int8pack_vs_fp32(seconds: float) -> list[dict]:
    """torch._weight_int8pack_mm (fp32 activations, int8 weights, per-channel scales) against an
    fp32 matmul, on the gate/up and LM-head shapes."""
    rows = []
    for name in ("gate_up", "lm_head"):
        k, n = smollm2_linears()[name]
        weight = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        scales = torch.rand(n)
        for m in (1, 8, 64):
            x = torch.randn(m, k)
            int8 = 2 * m * k * n / best_time(lambda: torch._weight_int8pack_mm(x, weight, scales), seconds) / 1e9
            fp32 = matmul_gflops(m, k, n, torch.float32, seconds)
            rows.append({"shape": name, "m": m, "int8pack_gflops": int8, "fp32_gflops": fp32, "slowdown": fp32 / int8})
    return rows


def run_int8(num_prompts: int, tokens: int, seconds: float) -> dict:
    other = OtherLoad()
    reference = engine()
    prompts = build_prompts(reference.tokenizer.encode, num_prompts, 128, 0)
    greedy(reference, prompts[:2], 4)                                    # warm-up
    fp32_out, fp32_records = greedy(reference, prompts, tokens)
    fp32_decode, fp32_prefill = forward_ms(fp32_records, num_prompts)
    result = {"prompts": num_prompts, "prompt_tokens": 128, "greedy_tokens": tokens,
              "fp32": {"decode_forward_ms": fp32_decode, "prefill_forward_ms": fp32_prefill}}
    model = reference.runner.model
    for label, spec in (("int8 all linears", {torch.nn.Linear}), ("int8 lm_head only", {"lm_head"})):
        with warnings.catch_warnings():                                  # torch.ao's deprecation notices
            warnings.simplefilter("ignore")
            reference.runner.model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), spec,
                                                                            dtype=torch.qint8)
        greedy(reference, prompts[:2], 4)
        out, records = greedy(reference, prompts, tokens)
        decode, prefill = forward_ms(records, num_prompts)
        same = [matching_prefix(a, b) for a, b in zip(fp32_out, out)]
        result[label] = {"decode_forward_ms": decode, "prefill_forward_ms": prefill,
                         "decode_speedup": fp32_decode / decode, "prefill_speedup": fp32_prefill / prefill,
                         "matching_tokens_mean": statistics.mean(same), "matching_tokens": same}
    reference.runner.model = model
    result["int8pack_mm"] = int8pack_vs_fp32(seconds)
    result["other_cpu_share"] = other.share()
    print(f"\n{'int8 (dynamic)':<20}{'decode ms':>10}{'prefill ms':>11}{'decode x':>9}{'prefill x':>10}"
          f"{'greedy tokens = fp32 (mean of ' + str(num_prompts) + ')':>38}")
    print(f"{'fp32':<20}{fp32_decode:>10.1f}{fp32_prefill:>11.1f}")
    for label in ("int8 all linears", "int8 lm_head only"):
        r = result[label]
        print(f"{label:<20}{r['decode_forward_ms']:>10.1f}{r['prefill_forward_ms']:>11.1f}{r['decode_speedup']:>8.2f}x"
              f"{r['prefill_speedup']:>9.2f}x{r['matching_tokens_mean']:>30.1f} of {tokens}")
    print(f"\n{'_weight_int8pack_mm':<20}{'m':>5}{'int8 GFLOP/s':>14}{'fp32 GFLOP/s':>14}{'fp32/int8':>11}")
    for r in result["int8pack_mm"]:
        print(f"{r['shape']:<20}{r['m']:>5}{r['int8pack_gflops']:>14.1f}{r['fp32_gflops']:>14.1f}{r['slowdown']:>10.1f}x")
    return result


# ---- profile -------------------------------------------------------------------------------------

def run_profile(steps: int) -> dict:
    other = OtherLoad()
    e = engine(budget=512)
    shape = ModelShape.of(e.model_config)
    cost = ModelCost(shape, 4)
    per_token = 2 * shape.linear_params / 1e9                           # decoder-layer linears, per token
    lm_head = 2 * shape.head_params / 1e9                               # per sampled row
    print(f"\nmodel FLOPs (telemetry/model_cost.py): {per_token:.3f} GFLOP per token in the decoder layers' "
          f"linears, {lm_head:.4f} GFLOP per sampled row in the LM head")
    prompts = build_prompts(e.tokenizer.encode, 32, 200, 0)
    params = SamplingParams(max_tokens=steps + 40, temperature=0.0, ignore_eos=True)
    for p in prompts:
        e.add_request(p, params)
    while True:                                                           # prefill until all 32 decode
        e.step()
        if e.last_record.num_prefill_tokens == 0 and e.last_record.num_decode_tokens == 32:
            break
    for _ in range(2):
        e.step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            e.step()
    for request_id in list(e.requests):
        e.abort(request_id)
    events = [(ev.key, ev.self_cpu_time_total) for ev in prof.key_averages()]
    total = sum(t for _, t in events)
    top = sorted(events, key=lambda kv: -kv[1])[:8]
    shares = {key: t / total for key, t in top}
    print(f"\ntorch profile, {steps} decode steps at batch 32: share of self CPU time")
    for key, share in shares.items():
        print(f"  {key:<50}{100 * share:>6.1f}%")

    rates = []
    long = build_prompts(e.tokenizer.encode, 4, 512, 0, seed=1)
    for p in long:
        e.add_request(p, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        while e.has_unfinished():
            e.step()
            r = e.last_record
            if r.num_prefill_tokens == 512:
                rates.append(cost.step_flops(r) / r.forward_s / 1e9)
    rates = rates[1:]                                                     # the first is a warm-up
    print(f"512-token prefill chunk (no cached context): model {statistics.median(rates):.1f} GFLOP/s "
          f"(median of {len(rates)}; FLOPs from telemetry/model_cost.py over the forward time)")
    return {"layer_gflop_per_token": per_token, "lm_head_gflop_per_row": lm_head,
            "decode_batch": 32, "steps": steps, "self_cpu_share": shares,
            "prefill512_model_gflops": statistics.median(rates), "other_cpu_share": other.share()}


def main() -> None:
    args = parse_args()
    summary: dict = {"machine": MachineInfo.collect().as_dict()}
    for section in args.only:
        wait_until_idle(args.wait_idle, args.max_other_cpu)
        if section == "matmul":
            summary["matmul"] = run_matmul(args.seconds, args.square)
        elif section == "int8":
            summary["int8"] = run_int8(args.int8_prompts, args.int8_tokens, args.seconds)
        else:
            summary["profile"] = run_profile(args.profile_steps)
        print(f"(other processes used {100 * summary[section]['other_cpu_share']:.0f}% of the CPU meanwhile)")
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
