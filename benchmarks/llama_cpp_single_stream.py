"""Batch-1 decode and 512-token prefill: this engine against llama.cpp's `llama-bench`, on the same GGUF
files, side by side in one run (docs/llama_cpp.md).

For each --models file, rounds alternate between the two so that a busy spell of the machine hits
both alike (--rounds, median over rounds):
  llama.cpp   `llama-bench -m FILE -t THREADS -p 512 -n 128 -r 1 -o json`: pp512 and tg128 tokens/s
  this engine the daemon's defaults (dtype and weights "auto": the quantized kernels) in this process:
              prefill = one 512-token prompt computed in one step (token budget 512), tokens/s;
              decode = 128 greedy steps of one sequence after a 16-token prompt (tg128 starts from an
              empty context), tokens/s from the median step time
--kernel-activations int8 runs this engine with llama.cpp's int8 activations (EngineConfig.kernel_activations;
the default, int16, is the daemon's). Ratios: ours / llama.cpp's tokens/s (>= 1.0: as fast or faster). The resident set after the engine
was built (--kv-tokens of fp16 KV pool, the daemon's pool size for the 135M default) is reported beside
the GGUF size x 1.3 + that pool (the memory bound docs/llama_cpp.md uses).

llama.cpp's `system_info` line (which instruction sets it runs) comes from a one-token `llama-completion` run. Threads: both use
--threads (default: the machine's cores).

    .venv/bin/python benchmarks/llama_cpp_single_stream.py --llama-bin /work/llama-peer/bin \\
        --models bundled ~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf \\
                 ~/.cache/autotuned-models/qwen2.5-coder-1.5b.gguf --json out/llama_cpp_single_stream.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench_common import MachineInfo, emit_summary, peer_env
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.checkpoint import bundled_model_path
from policies import Knobs

PREFILL_TOKENS = 512
DECODE_STEPS = 128
DECODE_PROMPT = 16


@dataclass
class Side:
    prefill_tok_s: float
    decode_tok_s: float


@dataclass
class ModelResult:
    model: str
    gguf_mb: float
    llama: Side
    ours: Side
    prefill_ratio: float        # ours / llama.cpp, tokens/s
    decode_ratio: float
    rss_mb: float               # this process after building the engine
    rss_bound_mb: float         # GGUF x 1.3 + KV pool
    rounds: int


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bin", required=True, help="folder holding llama-bench (benchmarks/build_llama_cpp.sh)")
    p.add_argument("--models", nargs="+", default=["bundled"], help="GGUF files; 'bundled': SmolLM2-135M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kv-tokens", type=int, default=8192, help="KV pool of the engine, in tokens (default 8192)")
    p.add_argument("--kernel-activations", choices=("int16", "int8"), default="int16",
                   help="this engine's quantized kernels' activations (default int16, the daemon's)")
    p.add_argument("--json", default=None)
    return p.parse_args()


def llama_bench(binary: str, model: str, threads: int) -> Side:
    out = subprocess.run([binary, "-m", model, "-t", str(threads), "-p", str(PREFILL_TOKENS), "-n", str(DECODE_STEPS),
                          "-r", "1", "-o", "json"], capture_output=True, text=True, check=True, env=peer_env()).stdout
    rows = json.loads(out)
    rate = {("pp" if r["n_prompt"] else "tg"): r["avg_ts"] for r in rows}
    return Side(rate["pp"], rate["tg"])


def build_engine(model: str, kv_tokens: int, activations: str) -> LLMEngine:
    block = 16
    return LLMEngine(EngineConfig(model=model, num_kv_blocks=kv_tokens // block, block_size=block,
                                  knobs=Knobs(token_budget=PREFILL_TOKENS, max_num_seqs=8),
                                  kernel_activations=activations))


def run_ours(engine: LLMEngine, round_: int) -> Side:
    vocab = engine.model_config.vocab_size
    prompt = [(1000 + 7919 * (i + round_)) % (vocab - 1000) + 500 for i in range(PREFILL_TOKENS)]
    engine.add_request(prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    t0 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    prefill_s = time.perf_counter() - t0
    engine.add_request(prompt[:DECODE_PROMPT], SamplingParams(max_tokens=DECODE_STEPS + 1, temperature=0.0,
                                                              ignore_eos=True))
    engine.step()                                   # the prompt and the first token
    steps = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    return Side(PREFILL_TOKENS / prefill_s, 1.0 / statistics.median(steps))


def measure(model: str, args: argparse.Namespace) -> ModelResult:
    path = bundled_model_path() if model == "bundled" else os.path.expanduser(model)
    engine = build_engine(path, args.kv_tokens, args.kernel_activations)
    gc.collect()
    rss = psutil.Process().memory_info().rss / 2**20
    llama, ours = [], []
    run_ours(engine, -1)                            # warm-up: first-touch of buffers
    for r in range(args.rounds):
        llama.append(llama_bench(os.path.join(args.llama_bin, "llama-bench"), path, args.threads))
        ours.append(run_ours(engine, r))
        print(f"  round {r}: llama.cpp {llama[-1]}, ours {ours[-1]}", flush=True)
    med = lambda sides, f: statistics.median(getattr(s, f) for s in sides)  # noqa: E731
    llama_m = Side(med(llama, "prefill_tok_s"), med(llama, "decode_tok_s"))
    ours_m = Side(med(ours, "prefill_tok_s"), med(ours, "decode_tok_s"))
    gguf_mb = os.path.getsize(path) / 2**20
    result = ModelResult(os.path.basename(path), gguf_mb, llama_m, ours_m, ours_m.prefill_tok_s / llama_m.prefill_tok_s,
                         ours_m.decode_tok_s / llama_m.decode_tok_s, rss, gguf_mb * 1.3 + engine.runner.kv_cache.nbytes / 2**20,
                         args.rounds)
    del engine
    gc.collect()
    return result


def system_info(llama_bin: str, model: str, threads: int) -> str | None:
    """llama.cpp's `system_info` line (the instruction sets it runs), from a one-token llama-completion run."""
    cli = os.path.join(llama_bin, "llama-completion")
    if not os.path.exists(cli):
        return None
    out = subprocess.run([cli, "-m", model, "-p", "hi", "-n", "1", "-t", str(threads), "--no-warmup"],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300, env=peer_env())
    return next((line.strip() for line in (out.stdout + out.stderr).splitlines() if "system_info" in line), None)


def load_results(path: str) -> list[ModelResult]:
    """The results of a --json file."""
    with open(path) as f:
        rows = json.load(f)["results"]
    return [ModelResult(**{**r, "llama": Side(**r["llama"]), "ours": Side(**r["ours"])}) for r in rows]


def markdown_table(results: list[ModelResult]) -> str:
    """One row a GGUF file (medians over rounds)."""
    rows = ["| GGUF | MB | prefill 512, tok/s: ours / llama.cpp | x | decode, tok/s: ours / llama.cpp | x | "
            "RSS MB (bound) |", "|---|---:|---|---:|---|---:|---|"]
    for r in results:
        rows.append(f"| {r.model} | {r.gguf_mb:.0f} | {r.ours.prefill_tok_s:.0f} / {r.llama.prefill_tok_s:.0f} | "
                    f"**{r.prefill_ratio:.2f}** | {r.ours.decode_tok_s:.1f} / {r.llama.decode_tok_s:.1f} | "
                    f"**{r.decode_ratio:.2f}** | {r.rss_mb:.0f} ({r.rss_bound_mb:.0f}) |")
    return "\n".join(rows)


def render_doc(sources: list[Path]) -> str:
    """A side-by-side table of results files, every row of each (benchmarks/render_docs.py)."""
    return markdown_table([r for s in sources for r in load_results(str(s))])


def _machine_key(summary: dict) -> tuple:
    return (summary["machine"]["cpu_model"], summary["machine"]["nproc"], summary.get("kernel_activations") or "int16")


def _machine_label(summary: dict) -> str:
    machine, isa = summary["machine"], set(summary.get("meta", {}).get("machine", {}).get("isa") or [])
    extensions = [name for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"),
                                          ("amx_tile", "AMX")) if flag in isa]
    return f"{machine['cpu_model']}, {machine['nproc']} cores" + (f" ({', '.join(extensions)})" if extensions else "")


def latest_per_gguf(sources: list[Path]) -> list[tuple[dict, list[tuple[ModelResult, str]]]]:
    """Per machine (and activation width), the latest row of each GGUF file: sources are given oldest first,
    and a later file's row for a file replaces an earlier one's. Each row keeps the name of its run."""
    machines: dict[tuple, tuple[dict, dict[str, tuple[ModelResult, str]]]] = {}
    for source in sources:
        summary = json.loads(source.read_text())
        _, rows = machines.setdefault(_machine_key(summary), (summary, {}))
        for r in load_results(str(source)):
            rows[r.model] = (r, source.name)
    return [(summary, list(rows.values())) for summary, rows in machines.values()]


def render_latest(sources: list[Path]) -> str:
    """docs/llama_cpp.md's table for one machine: the latest run of each GGUF file, and which run it is
    (ratios are within a run, rounds alternating; absolute rates move between runs)."""
    rows = ["| GGUF | MB | prefill 512, tok/s: ours / llama.cpp | x | decode, tok/s: ours / llama.cpp | x | "
            "RSS MB (bound) | run |", "|---|---:|---|---:|---|---:|---|---|"]
    for _, results in latest_per_gguf(sources):
        for r, run in results:
            rows.append(f"| {r.model} | {r.gguf_mb:.0f} | {r.ours.prefill_tok_s:.0f} / {r.llama.prefill_tok_s:.0f} | "
                        f"**{r.prefill_ratio:.2f}** | {r.ours.decode_tok_s:.1f} / {r.llama.decode_tok_s:.1f} | "
                        f"**{r.decode_ratio:.2f}** | {r.rss_mb:.0f} ({r.rss_bound_mb:.0f}) | {run} |")
    return "\n".join(rows)


def render_summary(sources: list[Path]) -> str:
    """One line a machine (and activation width): the range of the ratios over the latest run of each of its
    GGUF files (sources oldest first, as render_latest)."""
    rows = ["| machine (llama.cpp b11434, full build) | GGUF files | prefill 512: ours / llama.cpp | "
            "batch-1 decode: ours / llama.cpp |", "|---|---:|---|---|"]
    for summary, results in latest_per_gguf(sources):
        int8 = summary.get("kernel_activations") == "int8"
        rows.append(f"| {_machine_label(summary)}{'; int8 activations' if int8 else ''} | {len(results)} | "
                    f"{_ratio_range([r.prefill_ratio for r, _ in results])} | "
                    f"{_ratio_range([r.decode_ratio for r, _ in results])} |")
    return "\n".join(rows)


def render_activations(sources: list[Path]) -> str:
    """docs/cpu_kernels.md's int16 against int8 activations: two results files of the same files on one
    machine (the first int16, the second --kernel-activations int8), this engine's rates and llama.cpp's
    ratio in each."""
    runs = [{r.model: r for r in load_results(str(s))} for s in sources]
    rows = ["| GGUF | prefill 512, tok/s: int16 / int8 | x llama.cpp: int16 / int8 | decode, tok/s: int16 / int8 | "
            "x llama.cpp: int16 / int8 |", "|---|---|---|---|---|"]
    for model, a in runs[0].items():
        b = runs[1].get(model)
        if b is None:
            continue
        rows.append(f"| {model} | {a.ours.prefill_tok_s:.0f} / {b.ours.prefill_tok_s:.0f} | "
                    f"{a.prefill_ratio:.2f} / **{b.prefill_ratio:.2f}** | {a.ours.decode_tok_s:.1f} / "
                    f"{b.ours.decode_tok_s:.1f} | {a.decode_ratio:.2f} / {b.decode_ratio:.2f} |")
    return "\n".join(rows)


def _ratio_range(ratios: list[float]) -> str:
    at_parity = sum(x >= 1.0 for x in ratios)       # unrounded: a 0.997 prints 1.00 but is not at parity
    return f"{min(ratios):.2f}x-{max(ratios):.2f}x, >= 1.00x on {at_parity} of {len(ratios)}"


def main() -> None:
    args = parse_args()
    results = []
    for model in args.models:
        print(f"{model}:", flush=True)
        results.append(measure(model, args))
        r = results[-1]
        print(f"  prefill {r.ours.prefill_tok_s:.0f} vs {r.llama.prefill_tok_s:.0f} tok/s ({r.prefill_ratio:.2f}x), "
              f"decode {r.ours.decode_tok_s:.1f} vs {r.llama.decode_tok_s:.1f} tok/s ({r.decode_ratio:.2f}x), "
              f"RSS {r.rss_mb:.0f} MB (bound {r.rss_bound_mb:.0f})", flush=True)
    emit_summary({"machine": asdict(MachineInfo.collect()), "threads": args.threads,
                  "kernel_activations": args.kernel_activations,
                  "llama_cpp": {"bin": args.llama_bin,
                                "system_info": system_info(args.llama_bin, bundled_model_path(), args.threads)},
                  "results": [asdict(r) for r in results]}, args.json)
    print(markdown_table(results))


if __name__ == "__main__":
    main()
