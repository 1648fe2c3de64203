"""Offline throughput: our engine vs Hugging Face transformers `generate` on the same weights.

Both sides get the same token-id prompts (windows of real English text), generate exactly
`--output-len` tokens greedily (EOS ignored) and are timed end to end in one process. The engine
runs every request through LLM.generate (continuous batching, chunked prefill); transformers runs
left-padded static batches of `--hf-batch-size` requests. `--repeats` rounds of (engine, then HF)
give medians and a median ratio, so slow drift of the machine's speed hits both sides alike.

    python benchmarks/offline_throughput.py                      # full run (several minutes)
    python benchmarks/offline_throughput.py --num-requests 8 --output-len 16 --hf-batch-size 8 --repeats 1
    python benchmarks/offline_throughput.py --token-budget 256 512 1024 2048 --hf-batch-size 8 16 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from bench_common import (MachineInfo, OtherLoad, add_contention_args, build_prompts, emit_summary,
                          retry_contended)
import torch  # after bench_common, which imports the engine first (OpenMP wait policy)
from engine import LLM, SamplingParams
from engine.model.checkpoint import bundled_model_path
from engine.outputs import StepRecord


@dataclass(frozen=True)
class EngineResult:
    token_budget: int
    max_num_seqs: int
    elapsed_s: float
    output_tokens: int
    output_tok_s: float
    steps: int
    preemptions: int
    forward_share: float      # sum of forward_s over all steps / elapsed
    other_cpu_share: float    # CPU other processes used meanwhile (should be ~0)


@dataclass(frozen=True)
class HFResult:
    batch_size: int
    elapsed_s: float
    output_tokens: int
    output_tok_s: float
    other_cpu_share: float


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=64, help="requests in the workload (default 64)")
    p.add_argument("--prompt-len", type=int, default=200, help="mean prompt length in tokens (default 200)")
    p.add_argument("--prompt-jitter", type=int, default=10,
                   help="prompt lengths are uniform in prompt-len +- this (default 10)")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per request (default 128)")
    p.add_argument("--token-budget", type=int, nargs="+", default=[512],
                   help="engine token budget(s) per step; several values are run one after another "
                        "on the same engine (default 512)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="engine max running requests (default 256)")
    p.add_argument("--kv-cache-mb", type=float, default=1024.0,
                   help="engine KV pool in MiB (default 1024: holds all 64 x 328 tokens in fp32 without "
                        "preemption; the engine's own default of 512 does not)")
    p.add_argument("--dtype", default="auto", help="engine dtype: auto (default), fp32 or bf16")
    p.add_argument("--hf-batch-size", type=int, nargs="+", default=[32],
                   help="transformers static batch size(s); several values are run one after another "
                        "(default 32, the fastest of 8/16/32 in docs/benchmarks.md)")
    p.add_argument("--skip-hf", action="store_true", help="run only our engine")
    p.add_argument("--repeats", type=int, default=3,
                   help="rounds of (engine runs, then HF runs); medians and the ratio are taken over "
                        "the rounds (default 3: this VM's speed drifts ~10%% between minutes)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt windows (default 0)")
    add_contention_args(p)
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    return p.parse_args()


# -- our engine --

def run_engine(llm: LLM, prompts: list[list[int]], output_len: int, token_budget: int,
               max_num_seqs: int) -> tuple[EngineResult, list[list[int]]]:
    engine = llm.engine
    engine.set_knobs(token_budget=token_budget, max_num_seqs=max_num_seqs)
    records: list[StepRecord] = []
    engine.step_listeners.append(records.append)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    other = OtherLoad()
    start = time.perf_counter()
    completions = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    engine.step_listeners.remove(records.append)
    outputs = [c.token_ids for c in completions]
    tokens = sum(len(o) for o in outputs)
    result = EngineResult(token_budget, max_num_seqs, elapsed, tokens, tokens / elapsed, len(records),
                          sum(r.num_preempted for r in records), sum(r.forward_s for r in records) / elapsed,
                          other.share())
    return result, outputs


def warm_up_engine(llm: LLM, prompts: list[list[int]]) -> None:
    """First calls pay for oneDNN/allocator set-up; keep that out of the timed runs."""
    llm.generate(prompts[:4], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)


# -- Hugging Face transformers --

def load_hf_model():
    from transformers import AutoModelForCausalLM

    path = bundled_model_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    return model.eval()


def hf_generate_batch(model, batch: list[list[int]], output_len: int, pad_id: int) -> list[list[int]]:
    """One left-padded static batch, exactly `output_len` new tokens per row."""
    width = max(len(p) for p in batch)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in batch])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
                             max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=pad_id)
    return out[:, width:].tolist()


def run_hf(model, prompts: list[list[int]], output_len: int, batch_size: int,
           pad_id: int) -> tuple[HFResult, list[list[int]]]:
    outputs: list[list[int]] = []
    other = OtherLoad()
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        outputs += hf_generate_batch(model, prompts[i:i + batch_size], output_len, pad_id)
    elapsed = time.perf_counter() - start
    tokens = sum(len(o) for o in outputs)
    return HFResult(batch_size, elapsed, tokens, tokens / elapsed, other.share()), outputs


# -- comparison --

def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """How many greedy tokens both implementations agree on (fp32 kernels differ, so long runs may drift)."""
    prefixes = [common_prefix(a, b) for a, b in zip(ours, theirs)]
    return {"identical_requests": sum(a == b for a, b in zip(ours, theirs)), "requests": len(prefixes),
            "mean_common_prefix_tokens": sum(prefixes) / len(prefixes)}


def print_table(engine_results: list[EngineResult], hf_results: list[HFResult]) -> None:
    print(f"\n{'system':<34}{'time (s)':>10}{'out tok':>9}{'out tok/s':>11}{'steps':>7}{'preempt':>9}"
          f"{'other cpu':>11}")
    for r in engine_results:
        name = f"engine budget={r.token_budget} seqs={r.max_num_seqs}"
        print(f"{name:<34}{r.elapsed_s:>10.1f}{r.output_tokens:>9}{r.output_tok_s:>11.1f}{r.steps:>7}"
              f"{r.preemptions:>9}{100 * r.other_cpu_share:>10.0f}%")
    for r in hf_results:
        name = f"transformers batch={r.batch_size}"
        print(f"{name:<34}{r.elapsed_s:>10.1f}{r.output_tokens:>9}{r.output_tok_s:>11.1f}{'':>7}{'':>9}"
              f"{100 * r.other_cpu_share:>10.0f}%")


def medians(results: list, key: str) -> dict[int, float]:
    """Median output tok/s over the repeats, per token budget or per HF batch size."""
    groups: dict[int, list[float]] = {}
    for r in results:
        groups.setdefault(getattr(r, key), []).append(r.output_tok_s)
    return {k: statistics.median(v) for k, v in groups.items()}


def run_repeat(args: argparse.Namespace, llm: LLM, model, prompts: list[list[int]]):
    """One round: every token budget on our engine, then every HF batch size, back to back."""
    engine_results, hf_results, engine_outputs, hf_outputs = [], [], None, None
    for budget in args.token_budget:
        result, outputs = retry_contended(
            partial(run_engine, llm, prompts, args.output_len, budget, args.max_num_seqs),
            args.wait_idle, args.max_other_cpu, args.retries, share=lambda run: run[0].other_cpu_share)
        print(f"engine budget {budget}: {result.output_tok_s:.1f} output tok/s", flush=True)
        engine_results.append(result)
        engine_outputs = engine_outputs or outputs
    for batch_size in args.hf_batch_size if model is not None else []:
        result, outputs = retry_contended(
            partial(run_hf, model, prompts, args.output_len, batch_size, llm.engine.eos_token_ids[0]),
            args.wait_idle, args.max_other_cpu, args.retries, share=lambda run: run[0].other_cpu_share)
        print(f"transformers batch {batch_size}: {result.output_tok_s:.1f} output tok/s", flush=True)
        hf_results.append(result)
        hf_outputs = hf_outputs or outputs
    return engine_results, hf_results, engine_outputs, hf_outputs


def main() -> None:
    args = parse_args()
    llm = LLM(dtype=args.dtype, kv_cache_memory_mb=args.kv_cache_mb)
    dtype = str(llm.engine.runner.dtype).removeprefix("torch.")
    print(f"engine dtype ({args.dtype}): {dtype}, {llm.engine.block_manager.num_blocks} KV blocks")
    prompts = build_prompts(llm.tokenizer.encode, args.num_requests, args.prompt_len, args.prompt_jitter, args.seed)
    warm_up_engine(llm, prompts)
    model = None
    if not args.skip_hf:
        model = load_hf_model()
        hf_generate_batch(model, prompts[:2], 4, llm.engine.eos_token_ids[0])  # warm-up

    engine_results, hf_results = [], []
    ratios: dict[int, list[float]] = {}   # HF batch size -> per repeat: best engine tok/s / HF tok/s
    for _ in range(args.repeats):
        ours, theirs, engine_outputs, hf_outputs = run_repeat(args, llm, model, prompts)
        engine_results += ours
        hf_results += theirs
        best_ours = max(r.output_tok_s for r in ours)
        for r in theirs:
            ratios.setdefault(r.batch_size, []).append(best_ours / r.output_tok_s)

    print_table(engine_results, hf_results)
    engine_medians = medians(engine_results, "token_budget")
    best_budget = max(engine_medians, key=engine_medians.get)
    summary = {
        "machine": MachineInfo.collect().as_dict(),
        "dtype": dtype,
        "workload": {"num_requests": args.num_requests, "prompt_len": args.prompt_len,
                     "prompt_jitter": args.prompt_jitter, "output_len": args.output_len,
                     "prompt_tokens": sum(len(p) for p in prompts), "kv_cache_mb": args.kv_cache_mb},
        "repeats": args.repeats,
        "engine": [asdict(r) for r in engine_results],
        "hf": [asdict(r) for r in hf_results],
        "engine_median_output_tok_s": engine_medians,
        "best_engine_token_budget": best_budget,
    }
    if hf_results:
        hf_medians = medians(hf_results, "batch_size")
        best_batch = max(hf_medians, key=hf_medians.get)
        ratio = {b: statistics.median(v) for b, v in ratios.items()}
        summary |= {"hf_median_output_tok_s": hf_medians, "best_hf_batch_size": best_batch,
                    "ratios_per_repeat": ratios, "ratio_vs_hf_batch": ratio,
                    "ratio_engine_over_hf": ratio[best_batch],
                    "greedy_agreement": agreement(engine_outputs, hf_outputs)}
        hf_text = ", ".join(f"transformers batch {b}: {t:.1f}" for b, t in hf_medians.items())
        print(f"\nmedians over {args.repeats} repeat(s): engine {engine_medians[best_budget]:.1f} output tok/s "
              f"(budget {best_budget}); {hf_text}")
        for b, r in ratio.items():
            print(f"ours / transformers batch {b}: {r:.2f}x (median of per-repeat ratios; target >= 3x)")
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
