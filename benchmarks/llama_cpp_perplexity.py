"""Perplexity of this engine against `llama-perplexity` on the same GGUF files and the same text (docs/llama_cpp.md).

The text is the opening of Pride and Prejudice (tests/data) followed by bench_common's passage,
tokenized by each side from the GGUF's own vocabulary. Both score it as llama-perplexity does: chunks of
--ctx tokens (the first replaced by BOS where the model adds one), each chunk's second half predicted
from the tokens before it in the chunk; PPL = exp(mean negative log-likelihood). This engine runs the
daemon's defaults (the quantized kernels, 16-bit activations); llama.cpp its own CPU path (8-bit
activations). Ratio: ours / llama.cpp (the bar: within 1%).

    .venv/bin/python benchmarks/llama_cpp_perplexity.py --llama-bin /work/llama-peer/bin \\
        --models bundled ~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf --json out/llama_cpp_perplexity.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from bench_common import PASSAGE, MachineInfo, emit_summary, peer_env
from engine import EngineConfig, LLMEngine
from engine.model.checkpoint import bundled_model_path

TEXT = (pathlib.Path(__file__).parent.parent / "tests" / "data" / "pride_and_prejudice_ch1.txt").read_text() + "\n\n" + PASSAGE


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-bin", required=True, help="folder holding llama-perplexity (benchmarks/build_llama_cpp.sh)")
    p.add_argument("--models", nargs="+", default=["bundled"], help="GGUF files; 'bundled': SmolLM2-135M")
    p.add_argument("--ctx", type=int, default=128, help="tokens per chunk (default 128)")
    p.add_argument("--text", default=None, help="a text file to score instead (a longer one for a --ctx past a "
                                                "sliding window: llama-perplexity wants 2 x ctx tokens)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default=None)
    return p.parse_args()


def llama_perplexity(binary: str, model: str, text_path: str, ctx: int, threads: int) -> tuple[float, int]:
    """(PPL, chunks) from llama-perplexity's "Final estimate" line."""
    out = subprocess.run([binary, "-m", model, "-f", text_path, "-c", str(ctx), "-b", str(ctx), "-t", str(threads)],
                         capture_output=True, text=True, env=peer_env(), check=True)
    text = out.stdout + out.stderr
    ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", text).group(1))
    chunks = int(re.search(r"calculating perplexity over (\d+) chunks", text).group(1))
    return ppl, chunks


def our_perplexity(model: str, ctx: int, text: str = TEXT) -> tuple[float, int]:
    """(PPL, chunks) scored as llama-perplexity scores them."""
    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=64, block_size=16))
    return engine_perplexity(engine, ctx, add_bos(model), text)


def engine_perplexity(engine: LLMEngine, ctx: int, with_bos: bool, text: str = TEXT) -> tuple[float, int]:
    """(PPL, chunks) of the text on a built engine (tests/test_families.py's real-file test shares it)."""
    ids = engine.tokenizer.encode(text)
    bos = engine.model_config.bos_token_id if with_bos else None
    first = ctx // 2
    nll, count, chunks = 0.0, 0, len(ids) // ctx
    for c in range(chunks):
        chunk = ids[c * ctx:(c + 1) * ctx]
        if bos is not None:
            chunk = [bos] + chunk[1:]
        logits = engine.runner.prompt_logits(chunk).double()
        logp = torch.log_softmax(logits[first:ctx - 1], dim=-1)
        targets = torch.tensor(chunk[first + 1:ctx])
        nll -= logp.gather(1, targets[:, None]).sum().item()
        count += len(targets)
    return math.exp(nll / count), chunks


def add_bos(model: str) -> bool:
    import gguf
    field = gguf.GGUFReader(model).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.parts[field.data[0]][0]) if field is not None else False


def render_doc(sources: list[Path]) -> str:
    """The perplexity table of results files (benchmarks/render_docs.py)."""
    rows = ["| GGUF | chunks | PPL ours | PPL llama.cpp | ours / llama.cpp |", "|---|---:|---:|---:|---:|"]
    rows += [f"| {r['model']} | {r['ours_chunks']} | {r['ours_ppl']:.2f} | {r['llama_ppl']:.2f} | {r['ratio']:.3f} |"
             for r in _results(sources)]
    return "\n".join(rows)


def render_by_text(sources: list[Path]) -> str:
    """The same with the text (--text as recorded; "default": TEXT) and --ctx of each run."""
    rows = ["| GGUF | text | ctx | chunks | PPL ours | PPL llama.cpp | ours / llama.cpp |",
            "|---|---|---:|---:|---:|---:|---:|"]
    rows += [f"| {r['model']} | {r['text']} | {r['ctx']} | {r['ours_chunks']} | {r['ours_ppl']:.2f} | "
             f"{r['llama_ppl']:.2f} | {r['ratio']:.3f} |" for r in _results(sources)]
    return "\n".join(rows)


def _results(sources: list[Path]) -> list[dict]:
    return [r for s in sources for r in json.loads(s.read_text())["results"]]


def main() -> None:
    args = parse_args()
    results = []
    text = pathlib.Path(args.text).read_text() if args.text else TEXT
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    for model in args.models:
        path = bundled_model_path() if model == "bundled" else os.path.expanduser(model)
        llama_ppl, llama_chunks = llama_perplexity(os.path.join(args.llama_bin, "llama-perplexity"), path, f.name,
                                                   args.ctx, args.threads)
        ours, chunks = our_perplexity(path, args.ctx, text)
        results.append({"model": os.path.basename(path), "ctx": args.ctx, "text": args.text or "default",
                        "llama_ppl": llama_ppl,
                        "llama_chunks": llama_chunks, "ours_ppl": ours, "ours_chunks": chunks, "ratio": ours / llama_ppl})
        print(f"{os.path.basename(path)}: ours {ours:.4f} ({chunks} chunks), llama.cpp {llama_ppl:.4f} "
              f"({llama_chunks} chunks): {ours / llama_ppl:.4f}x", flush=True)
    os.unlink(f.name)
    emit_summary({"machine": MachineInfo.collect().as_dict(), "results": results}, args.json)


if __name__ == "__main__":
    main()
