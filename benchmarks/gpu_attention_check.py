"""The attention backends on a GPU against the CPU's fp32 reference, inside the engine, step by step.

One small random Hugging Face Llama (4 layers, 8 query / 2 KV heads of 64 dims) serves 5 greedy prompts with a
token budget of 64 (prompts chunked beside decodes: chunks with cached context) and of 512 (whole prompts).
Per GPU dtype and backend, each request's logits rows are compared with the reference's at every step while
its sampled tokens agree (tests/step_trace.py); where a token first differs, both top-2 margins are printed: a
margin below the 16-bit rounding is a near tie flipped, not a wrong kernel.

Comparing only the first all-decode step's logits would count a request that parted at a near tie in an
earlier mixed step as a large error; comparing rows while the histories agree does not.

    python benchmarks/gpu_attention_check.py [--steps] [--device cpu (smoke run, TRITON_INTERPRET=1)]
    python benchmarks/gpu_attention_check.py --json docs/results/gpu_h100_attention_check.json

--json stores the printed lines with the run's meta; render_doc turns them into docs/gpu.md's table
(benchmarks/render_docs.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

if __name__ == "__main__":   # the engine and the tests' helpers; render_doc needs neither
    from engine import EngineConfig, LLMEngine
    from policies import Knobs
    from tests.conftest import save_hf_model
    from tests.step_trace import RowError, TracedStep, errors_while_histories_agree, top2_margin, trace_steps
    from tests.test_cuda_engine import PROMPTS, free_gpu

SUMMARY = re.compile(r"^budget (\d+) (\w+) (\w+): worst row error ([\d.]+) over (\d+) rows \((\d+) in steps with "
                     r"prefill tokens\), (\d+) of (\d+) requests parted$")
PARTING = re.compile(r"^  prompt \d+ parts at step \d+: ref token \d+ \(top-2 margin ([\d.]+)\)")


def traced(model: str, device: str, dtype: str, backend: str, budget: int) -> list[TracedStep]:
    engine = LLMEngine(EngineConfig(model=model, device=device, dtype=dtype, attention_backend=backend,
                                    num_kv_blocks=256, cuda_graphs=False, knobs=Knobs(token_budget=budget)))
    steps = trace_steps(engine, [[t % 990 + 5 for t in p] for p in PROMPTS[:5]])
    del engine
    if device.startswith("cuda"):
        free_gpu()
    return steps


LINES: list[str] = []     # what report printed, for --json


def emit(line: str) -> None:
    print(line)
    LINES.append(line)


def report(name: str, got: list[TracedStep], ref: list[TracedStep], per_step: bool) -> None:
    rows = errors_while_histories_agree(got, ref)
    mixed = [r for r in rows if not r.all_decode]
    emit(f"{name}: worst row error {max(r.error for r in rows):.4f} over {len(rows)} rows "
         f"({len(mixed)} in steps with prefill tokens), {sum(not r.same_token for r in rows)} of 5 requests parted")
    for r in rows:
        if per_step:
            emit(f"  step {r.step} prompt {r.prompt}{' decode-only' if r.all_decode else ''}: {r.error:.4f}")
        if not r.same_token:
            emit(f"  prompt {r.prompt} parts at step {r.step}: {describe(r, got, ref)}")


def describe(r: RowError, got: list[TracedStep], ref: list[TracedStep]) -> str:
    want, have = ref[r.step], got[r.step]
    return (f"ref token {want.tokens[r.prompt]} (top-2 margin {top2_margin(want.logits[r.prompt]):.4f}), "
            f"got {have.tokens[r.prompt]} (margin {top2_margin(have.logits[r.prompt]):.4f}), row error {r.error:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", action="store_true", help="every compared row's error")
    p.add_argument("--json", help="store the printed lines with the run's meta (benchmarks/results_file.py)")
    args = p.parse_args()
    model = tempfile.mkdtemp()
    save_hf_model(model, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
    for budget in (64, 512):
        ref = traced(model, "cpu", "fp32", "torch", budget)
        for dtype in ("fp32", "bf16"):
            for backend in ("torch", "triton"):
                got = traced(model, args.device, dtype, backend, budget)
                report(f"budget {budget} {dtype} {backend}", got, ref, args.steps)
    if args.json:
        from benchmarks import results_file
        results_file.write(args.json, {"device": args.device, "lines": LINES})


def render_doc(sources: list[Path]) -> str:
    """docs/gpu.md's table (benchmarks/render_docs.py): one row per budget, dtype and backend of a
    results file of this script (--json), with the reference's top-2 margin where a request parted."""
    lines = ["| token budget | dtype | backend | rows compared (with prefill) | worst row error | requests parted | "
             "reference's top-2 margin where they parted |", "|---:|---|---|---:|---:|---:|---|"]
    row, margins = None, []

    def flush() -> None:
        if row:
            lines.append(row + (", ".join(margins) if margins else "") + " |")

    for text in json.loads(Path(sources[0]).read_text())["lines"]:
        if m := SUMMARY.match(text):
            flush()
            budget, dtype, backend, worst, rows, mixed, parted, total = m.groups()
            row, margins = f"| {budget} | {dtype} | {backend} | {rows} ({mixed}) | {worst} | {parted} of {total} | ", []
        elif (m := PARTING.match(text)) and row:
            margins.append(m[1])
    flush()
    return "\n".join(lines)


if __name__ == "__main__":
    main()
