"""The bundled SmolLM2-135M on its GGUF's quantized weights (engine/kernels/quantized_linear.py, #15) against the
same weights dequantized to fp32, side by side in one run:

  bandwidth  the machine's memory bandwidth, measured here: a STREAM-like copy of --bandwidth-mb MB
             (bytes read + written per second, best of 5) and a read-only pass (a sum)
  decode     engine step time at each --batch-sizes (pure decode steps, ~--context tokens cached per
             sequence; median of --steps), for weights=quantized (the crossover measured at start-up
             picks kernel or dequantize + fp32 GEMM per step) and weights=dense (fp32)
  prefill    tokens/s of --chunk-token prefill chunks (budget = chunk), both modes, and the quantized
             mode with every step forced onto the kernels (what the crossover avoids)
  linear     GMAC/s of the model's linear layers (one layer's four and the LM head) at --linear-rows rows:
             on GGUF's layout the kernels' 16-bit path and their fp32 panel path, on rows interleaved
             in groups of 16 the x16 path (VNNI or AVX2), and torch's fp32 matmul on the same weights
             dequantized beforehand
  floor      weight bytes one decode step streams (every layer matrix and the LM head once) over the
             copy bandwidth: batch-1 decode time / floor says how close a step is to the memory limit
  memory     resident set of a fresh process right after it built an engine with the daemon's defaults
             (a 256 MiB KV pool, fp16 on the CPU kernels, resident from the start), per weights mode
  accuracy   every step on the kernels (the "kernels only" engine) against fp32: greedy agreement over the
             first 64 tokens of --agreement-prompts prompts (up to each prompt's first difference); perplexity of tests/data/pride_and_prejudice_ch1.txt; the
             largest logit difference from fp32 on that text, for the kernels (16-bit activations) and
             for fp32 weights with activations rounded to 8 bits per block of 32 (llama.cpp's Q8_0)

Steps are timed with benchmarks/step_time.py's decode and prefill drivers, each after waiting for an
idle CPU, and taken again when other processes used more than --max-other-cpu of it. --threads sets
torch's threads and the kernels' pool alike (default: torch's, the physical cores); on a CPU other
processes keep busy, 1 thread times the work itself, where 2 wait on descheduled threads.

    python benchmarks/quantized_kernels.py
    python benchmarks/quantized_kernels.py --batch-sizes 1 8 --steps 5 --json /tmp/quantized.json
    python benchmarks/quantized_kernels.py --threads 1
    QLINEAR_ISA=avx2 python benchmarks/quantized_kernels.py    # the kernels as on a CPU without AVX-512
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import partial

from bench_common import MachineInfo, add_contention_args, build_prompts, emit_summary, retry_contended
import torch  # after bench_common, which imports the engine first (OpenMP wait policy)
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.llm_engine import release_freed_memory
from engine.model.checkpoint import fuse_quantized, load_checkpoint
from engine.model_runner import merge_same_type
from engine.kernels.quantized_linear import PANEL_ROWS, QuantizedLinear, QuantizedPath, best_time
from policies import Knobs
from step_time import StepStats, measure_decode, measure_prefill


@dataclass(frozen=True)
class Bandwidth:
    copy_gb_s: float          # (read + write) bytes / s of a large tensor copy
    read_gb_s: float          # bytes / s of a sum over the same tensor


@dataclass(frozen=True)
class Accuracy:
    prompts: int
    tokens_per_prompt: int
    agreed_share: float           # greedy tokens equal to fp32's, counted up to each prompt's first difference
    perplexity_dense: float
    perplexity_quantized: float
    logit_dev_kernels: float      # max |logit - fp32 logit| over the text
    logit_dev_8bit: float         # the same, fp32 weights with 8-bit per-block activations


@dataclass
class Outputs:
    """What one mode produced, for the accuracy comparison."""
    tokens: list[list[int]]
    text_ids: list[int]
    logits: torch.Tensor
    logits_8bit: torch.Tensor | None = None


@dataclass(frozen=True)
class ModeResult:
    mode: str                 # "quantized", "dense" or "quantized, kernels only"
    weight_mb: float          # bytes a decode step streams: layer matrices + LM head
    max_rows: int | None      # quantized: steps of up to this many rows run on the kernels
    steps: list[StepStats]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--context", type=int, default=128, help="prompt tokens per decode sequence (default 128)")
    p.add_argument("--steps", type=int, default=10, help="timed decode steps per batch size (default 10)")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk = token budget (default 512)")
    p.add_argument("--prefill-requests", type=int, default=3,
                   help="prompts of 2 chunks prefilled; the first is a warm-up (default 3)")
    p.add_argument("--linear-rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64],
                   help="row counts of the linear-layer comparison (default 1 4 8 16 32 64)")
    p.add_argument("--bandwidth-mb", type=int, default=512, help="size of the copied tensor (default 512)")
    p.add_argument("--threads", type=int, default=None, help="torch and kernel threads (default: torch's)")
    p.add_argument("--agreement-prompts", type=int, default=20, help="prompts for greedy agreement (default 20)")
    add_contention_args(p)
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    return p.parse_args()


def measure_bandwidth(mb: int, repeats: int = 5) -> Bandwidth:
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    copy_s = best_time(lambda: dst.copy_(src), repeats)
    read_s = best_time(lambda: src.sum(), repeats)
    return Bandwidth(2 * src.nbytes / copy_s / 1e9, src.nbytes / read_s / 1e9)


def streamed_weight_bytes(model: torch.nn.Module) -> int:
    """Every matrix a decode step reads in full (the embedding only gives rows)."""
    total = 0
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            total += module.nbytes
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def build_engine(args: argparse.Namespace, weights: str, max_rows: int | None) -> LLMEngine:
    max_batch = max(args.batch_sizes)
    decode_len = args.context + args.warmup_steps + args.steps + 64
    blocks = max(max_batch * -(-decode_len // 16), args.prefill_requests * 2 * args.chunk // 16) + 16
    config = EngineConfig(dtype="fp32", weights=weights, quantized_max_rows=max_rows, num_kv_blocks=blocks,
                          block_size=16, enable_prefix_caching=False,   # every prompt is computed
                          knobs=Knobs(token_budget=max(args.chunk, max_batch), max_num_seqs=max(256, max_batch)))
    return LLMEngine(config)


TEXT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "pride_and_prejudice_ch1.txt"


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {out.request_id: out.token_ids for out in engine.step() if out.finished}
    return [done[i] for i in ids]


def fake_8bit(module: torch.nn.Module, args: tuple) -> tuple:
    """An input rounded as llama.cpp's Q8_0 activations are: per block of 32, d = max|x| / 127."""
    x = args[0]
    blocks = x.float().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    return (torch.where(d > 0, torch.round(blocks / torch.where(d > 0, d, 1)) * d, 0).reshape(x.shape),)


def outputs(engine: LLMEngine, prompts: list[list[int]], text_ids: list[int], with_8bit: bool) -> Outputs:
    result = Outputs(greedy_tokens(engine, prompts, 64), text_ids, engine.runner.prompt_logits(text_ids))
    if with_8bit:
        hooks = [m.register_forward_pre_hook(fake_8bit) for m in engine.runner.model.modules()
                 if isinstance(m, torch.nn.Linear)]
        result.logits_8bit = engine.runner.prompt_logits(text_ids)
        for h in hooks:
            h.remove()
    return result


def accuracy(dense: Outputs, quantized: Outputs) -> Accuracy:
    agreed = sum(next((i for i, (a, b) in enumerate(zip(d, q)) if a != b), len(d))
                 for d, q in zip(dense.tokens, quantized.tokens))
    target = torch.tensor(dense.text_ids[1:])
    ppl = lambda logits: torch.exp(torch.nn.functional.cross_entropy(logits[:-1].double(), target)).item()  # noqa: E731
    return Accuracy(len(dense.tokens), 64, agreed / (64 * len(dense.tokens)), ppl(dense.logits), ppl(quantized.logits),
                    (quantized.logits - dense.logits).abs().max().item(),
                    (dense.logits_8bit - dense.logits).abs().max().item())


def run_mode(args: argparse.Namespace, mode: str, weights: str, max_rows: int | None, decode: bool,
             evaluate: bool = False) -> tuple[ModeResult, Outputs | None]:
    engine = build_engine(args, weights, max_rows)
    model = engine.runner.model
    path = getattr(model.lm_head, "path", None)
    contention = (args.wait_idle, args.max_other_cpu, args.retries)
    steps: list[StepStats] = []
    if decode:
        prompts = build_prompts(engine.tokenizer.encode, max(args.batch_sizes), args.context, 0)
        measure_decode(engine, prompts, min(8, max(args.batch_sizes)), 2, 1)       # warm-up, discarded
        steps += [retry_contended(partial(measure_decode, engine, prompts, b, args.steps, args.warmup_steps),
                                  *contention) for b in args.batch_sizes]
    engine.set_knobs(token_budget=args.chunk)
    long_prompts = build_prompts(engine.tokenizer.encode, args.prefill_requests, 2 * args.chunk, 0, seed=1)
    steps += retry_contended(partial(measure_prefill, engine, long_prompts, args.chunk), *contention,
                             share=lambda results: results[0].other_cpu_share)
    result = ModeResult(mode, streamed_weight_bytes(model) / 1e6, path.max_rows if path else None, steps)
    evaluated = None
    if evaluate:
        prompts = build_prompts(engine.tokenizer.encode, args.agreement_prompts, 24, 16, seed=2)
        evaluated = outputs(engine, prompts, engine.tokenizer.encode(TEXT.read_text()), with_8bit=weights == "dense")
    del engine, model
    gc.collect()
    release_freed_memory()
    return result, evaluated


RSS_SNIPPET = """
import psutil
from engine import EngineConfig, LLMEngine
engine = LLMEngine(EngineConfig(weights={weights!r}))
print(psutil.Process().memory_info().rss / 2**20, engine.runner.kv_cache.nbytes / 2**20)
"""


def fresh_rss_mib(weights: str) -> dict[str, float]:
    """A new interpreter builds the bundled model's engine with the daemon's defaults: its RSS, and how much
    of it is the KV pool (torch.zeros writes the pool, so all of it is resident from the start)."""
    out = subprocess.run([sys.executable, "-c", RSS_SNIPPET.format(weights=weights)], capture_output=True, text=True,
                         check=True, cwd=pathlib.Path(__file__).resolve().parent.parent)
    rss, kv = (float(v) for v in out.stdout.strip().splitlines()[-1].split())
    return {"rss": rss, "kv_pool": kv}


def gguf_layout_linears(model: torch.nn.Module, kernels) -> list[QuantizedLinear]:
    """Layer 0's four projections and the LM head in GGUF's own row-after-row layout, read again from the
    bundled file (the engine's are interleaved wherever the AVX2 kernels run), same-type parts merged as the
    loader merges them."""
    config = model.config
    fused = fuse_quantized(load_checkpoint(None, weights="quantized").quantized, config)
    names = [f"model.layers.0.self_attn.{n}" for n in ("qkv_proj", "o_proj")]
    names += [f"model.layers.0.mlp.{n}" for n in ("gate_up_proj", "down_proj")] + ["lm_head"]
    return [QuantizedLinear(merge_same_type(fused[n]), None, QuantizedPath(kernels, 1 << 30)) for n in names]


def linear_paths(args: argparse.Namespace) -> list[dict]:
    """GMAC/s of the model's linear layers (layer 0's fused QKV, O, fused gate/up and down, and the LM
    head), per row count: on GGUF's layout the kernels' 16-bit path and fp32 panel path (each forced), on
    rows interleaved in groups of 16 the x16 path (VNNI or AVX2: what the engine runs there), and
    torch's fp32 matmul on the same weights already dequantized (no dequantization counted)."""
    engine = build_engine(args, "quantized", 1 << 30)
    model = engine.runner.model
    layer = model.model.layers[0]
    engine_linears = [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj,
                      model.lm_head]
    kernels = engine.runner.quantized_path.kernels
    interleaved = all(p.interleaved for linear in engine_linears for p in linear.parts)
    rows_out = []
    for n in args.linear_rows:
        times = {"int16": 0.0, "panel": 0.0, "fp32": 0.0} | ({"x16": 0.0} if interleaved else {})
        macs = 0
        for linear, row_major in zip(engine_linears, gguf_layout_linears(model, kernels)):
            x = torch.randn(n, linear.in_features)
            dense = torch.cat([kernels.dequantize(p) for p in row_major.parts])
            for path, rows in (("int16", 1 << 30), ("panel", 1)):
                kernels.set_panel_rows(rows)
                times[path] += best_time(lambda: row_major.quantized(x), 5)
            kernels.set_panel_rows(PANEL_ROWS)
            if interleaved:
                times["x16"] += best_time(lambda: linear.quantized(x), 5)
            times["fp32"] += best_time(lambda: torch.matmul(x, dense.t()), 5)
            macs += n * linear.in_features * linear.out_features
        rows_out.append({"rows": n} | {path: macs / t / 1e9 for path, t in times.items()})
        print(f"linear layers, {n} rows: " + ", ".join(f"{k} {v:.1f}" for k, v in rows_out[-1].items() if k != "rows")
              + " GMAC/s")
    del engine
    release_freed_memory()
    return rows_out


def print_table(bandwidth: Bandwidth, results: list[ModeResult]) -> None:
    print(f"\nbandwidth: copy {bandwidth.copy_gb_s:.1f} GB/s (read + write), read {bandwidth.read_gb_s:.1f} GB/s")
    print(f"\n{'mode':<26}{'step':<14}{'ctx':>6}{'wall ms':>9}{'fwd ms':>8}{'tok/s':>9}{'other cpu':>11}")
    for r in results:
        for s in r.steps:
            print(f"{r.mode:<26}{s.kind + ' ' + str(s.batch):<14}{s.context:>6}{1e3 * s.wall_s:>9.1f}"
                  f"{1e3 * s.forward_s:>8.1f}{s.tokens_per_s:>9.1f}{100 * s.other_cpu_share:>10.0f}%")
    for r in results:
        print(f"{r.mode}: {r.weight_mb:.0f} MB streamed per decode step"
              + (f", kernels for steps of up to {r.max_rows} rows" if r.max_rows is not None else ""))


def floors(bandwidth: Bandwidth, results: list[ModeResult]) -> dict[str, dict[str, float]]:
    """Batch-1 decode forward time against weight bytes / copy bandwidth."""
    out = {}
    for r in results:
        one = next((s for s in r.steps if s.kind == "decode" and s.batch == 1), None)
        if one is None:
            continue
        floor_s = r.weight_mb * 1e6 / (bandwidth.copy_gb_s * 1e9)
        out[r.mode] = {"floor_ms": 1e3 * floor_s, "forward_ms": 1e3 * one.forward_s, "wall_ms": 1e3 * one.wall_s,
                       "forward_over_floor": one.forward_s / floor_s}
        print(f"{r.mode}: batch-1 decode forward {1e3 * one.forward_s:.1f} ms = "
              f"{one.forward_s / floor_s:.2f}x the floor of {1e3 * floor_s:.1f} ms")
    return out


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)                   # the kernels' pool takes torch's count at load
    bandwidth = retry_contended(lambda: measure_bandwidth(args.bandwidth_mb), args.wait_idle, args.max_other_cpu, 0,
                                share=lambda _: 0.0)
    linear = retry_contended(lambda: linear_paths(args), args.wait_idle, args.max_other_cpu, 0, share=lambda _: 0.0)
    quantized, _ = run_mode(args, "quantized", "quantized", None, decode=True)
    dense, d_out = run_mode(args, "dense", "dense", None, decode=True, evaluate=True)
    # accuracy on the kernels alone: with the crossover, long prompts would take the dense path
    kernels_only, q_out = run_mode(args, "quantized, kernels only", "quantized", 1 << 30, decode=False, evaluate=True)
    results = [quantized, dense, kernels_only]
    print_table(bandwidth, results)
    rss = {weights: fresh_rss_mib(weights) for weights in ("quantized", "dense")}
    print("RSS of a fresh process after loading: " + ", ".join(
        f"{w} {r['rss']:.0f} MiB (KV pool {r['kv_pool']:.0f})" for w, r in rss.items()))
    acc = accuracy(d_out, q_out)
    print(f"accuracy: {100 * acc.agreed_share:.1f}% of {acc.prompts} x {acc.tokens_per_prompt} greedy tokens as fp32's; "
          f"perplexity {acc.perplexity_quantized:.4f} vs {acc.perplexity_dense:.4f}; largest logit difference "
          f"{acc.logit_dev_kernels:.4f} (kernels), {acc.logit_dev_8bit:.4f} (8-bit activations)")
    summary = {"machine": MachineInfo.collect().as_dict(), "threads": torch.get_num_threads(),
               "bandwidth": asdict(bandwidth), "linear_gmac_s": linear,
               "floors": floors(bandwidth, results), "accuracy": asdict(acc), "rss_mib": rss,
               "results": [asdict(r) for r in results]}
    emit_summary(summary, args.json)


if __name__ == "__main__":
    main()
