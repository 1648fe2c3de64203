"""What the quantized kernels' activation precision costs in output: int16 (the default) against int8
(`kernel_activations=int8`, llama.cpp's Q8_0 activations), each beside the same GGUF dequantized to fp32.

For each --models file, three engines: fp32 (weights dequantized, fp32 KV cache) and the quantized weights
with int16 and with int8 activations (every step on the kernels). Per engine against fp32:
  agreement   the first 64 greedy tokens of 20 prompts, counted up to each prompt's first difference (the
              tests' bar on the bundled model: >= 90%)
  4 prompts   whether 32 greedy tokens of 4 prompts equal fp32's (the tests' bar on the 0.5B file)
  perplexity  of the opening of Pride and Prejudice (tests/data) in one prompt, and its ratio to fp32's

    .venv/bin/python benchmarks/activation_precision.py --models bundled ~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf \\
        --json docs/results/activation_precision.json
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import bench_common  # noqa: F401  (imports engine before torch: OMP_WAIT_POLICY)
import results_file
import torch

from bench_common import emit_summary
from engine import LLM, SamplingParams
from engine.model.checkpoint import bundled_model_path

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "data" / "pride_and_prejudice_ch1.txt"


@dataclass
class Precision:
    model: str
    activations: str          # int16 or int8
    agreement: float          # share of 20 x 64 greedy tokens equal to fp32's up to each first difference
    four_prompts_equal: bool  # 32 greedy tokens of 4 prompts, all equal to fp32's
    perplexity: float
    fp32_perplexity: float

    @property
    def perplexity_ratio(self) -> float:
        return self.perplexity / self.fp32_perplexity


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["bundled"], help="GGUF files; 'bundled': SmolLM2-135M")
    p.add_argument("--json", default=None)
    return p.parse_args()


def perplexity(llm: LLM) -> float:
    ids = llm.tokenizer.encode(TEXT.read_text())
    logits = llm.engine.runner.prompt_logits(ids)[:-1].double()
    return torch.exp(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))).item()


def greedy(llm: LLM, prompts: list[str], tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def agreement(reference: list[list[int]], other: list[list[int]], tokens: int) -> float:
    agreed = sum(next((i for i, (a, b) in enumerate(zip(r, o)) if a != b), tokens) for r, o in zip(reference, other))
    return agreed / (tokens * len(reference))


def measure(model: str) -> list[Precision]:
    sys.path.insert(0, str(ROOT))
    from tests.test_quantized_linear import AGREEMENT_PROMPTS, QWEN_PROMPTS   # the tests' prompts
    path = None if model == "bundled" else os.path.expanduser(model)
    name = os.path.basename(path or bundled_model_path())
    fp32 = LLM(path, dtype="fp32", kv_cache_memory_mb=64, weights="dense", kv_cache_dtype="fp32")
    ref20, ref4, ref_ppl = greedy(fp32, AGREEMENT_PROMPTS, 64), greedy(fp32, QWEN_PROMPTS, 32), perplexity(fp32)
    del fp32
    results = []
    for activations in ("int16", "int8"):
        llm = LLM(path, dtype="fp32", kv_cache_memory_mb=64, weights="quantized", quantized_max_rows=100_000,
                  kernel_activations=activations)
        results.append(Precision(name, activations,
                                 agreement(ref20, greedy(llm, AGREEMENT_PROMPTS, 64), 64),
                                 greedy(llm, QWEN_PROMPTS, 32) == ref4, perplexity(llm), ref_ppl))
        del llm
    return results


def markdown_table(rows: list[dict]) -> str:
    out = ["| GGUF | activations | greedy agreement with fp32 (20 x 64 tokens) | 4 prompts x 32 tokens equal | "
           "perplexity (fp32) | ratio |", "|---|---|---:|---|---|---:|"]
    for r in rows:
        p = Precision(**r)
        out.append(f"| {p.model} | {p.activations} | {100 * p.agreement:.1f}% | {'yes' if p.four_prompts_equal else 'no'} "
                   f"| {p.perplexity:.3f} ({p.fp32_perplexity:.3f}) | {p.perplexity_ratio:.4f} |")
    return "\n".join(out)


def render_doc(sources: list[Path]) -> str:
    """docs/cpu_kernels.md's table of a results file (benchmarks/render_docs.py)."""
    return markdown_table([r for s in sources for r in results_file.read(s)["results"]])


def main() -> None:
    args = parse_args()
    rows = [asdict(r) for model in args.models for r in measure(model)]
    emit_summary({"results": rows}, args.json)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
