"""The attention backends on a GPU against the CPU's fp32 reference, inside the engine, step by step.

One small random Hugging Face Llama (4 layers, 8 query / 2 KV heads of 64 dims) serves 5 greedy prompts with a
token budget of 64 (prompts chunked beside decodes: chunks with cached context) and of 512 (whole prompts).
Per GPU dtype and backend, each request's logits rows are compared with the reference's at every step while
its sampled tokens agree (tests/step_trace.py); where a token first differs, both top-2 margins are printed: a
margin below the 16-bit rounding is a near tie flipped, not a wrong kernel.

This is how the "Triton chunk bug" of docs/gpu.md was found to be none: the first all-decode step's logits
compared 0.60 off because one request had parted at a near tie (reference margin 0.008) in a mixed step;
every row before that was 0.02 off, as torch's.

    python benchmarks/gpu_attention_check.py [--steps] [--device cpu (smoke run, TRITON_INTERPRET=1)]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from engine import EngineConfig, LLMEngine  # noqa: E402
from policies import Knobs  # noqa: E402
from tests.conftest import save_hf_model  # noqa: E402
from tests.step_trace import RowError, TracedStep, errors_while_histories_agree, top2_margin, trace_steps  # noqa: E402
from tests.test_cuda_engine import PROMPTS, free_gpu  # noqa: E402


def traced(model: str, device: str, dtype: str, backend: str, budget: int) -> list[TracedStep]:
    engine = LLMEngine(EngineConfig(model=model, device=device, dtype=dtype, attention_backend=backend,
                                    num_kv_blocks=256, cuda_graphs=False, knobs=Knobs(token_budget=budget)))
    steps = trace_steps(engine, [[t % 990 + 5 for t in p] for p in PROMPTS[:5]])
    del engine
    if device.startswith("cuda"):
        free_gpu()
    return steps


def report(name: str, got: list[TracedStep], ref: list[TracedStep], per_step: bool) -> None:
    rows = errors_while_histories_agree(got, ref)
    mixed = [r for r in rows if not r.all_decode]
    print(f"{name}: worst row error {max(r.error for r in rows):.4f} over {len(rows)} rows "
          f"({len(mixed)} in steps with prefill tokens), {sum(not r.same_token for r in rows)} of 5 requests parted")
    for r in rows:
        if per_step:
            print(f"  step {r.step} prompt {r.prompt}{' decode-only' if r.all_decode else ''}: {r.error:.4f}")
        if not r.same_token:
            print(f"  prompt {r.prompt} parts at step {r.step}: {describe(r, got, ref)}")


def describe(r: RowError, got: list[TracedStep], ref: list[TracedStep]) -> str:
    want, have = ref[r.step], got[r.step]
    return (f"ref token {want.tokens[r.prompt]} (top-2 margin {top2_margin(want.logits[r.prompt]):.4f}), "
            f"got {have.tokens[r.prompt]} (margin {top2_margin(have.logits[r.prompt]):.4f}), row error {r.error:.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", action="store_true", help="every compared row's error")
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


if __name__ == "__main__":
    main()
