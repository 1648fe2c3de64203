"""Where the attention backends on a GPU depart from the CPU's fp32 reference, inside the engine.

One small random Hugging Face Llama (4 layers, 8 query / 2 KV heads of 64 dims) serves 5 prompts with a
token budget of 64 (prompts chunked beside decodes: chunks with cached context) and of 512 (no such chunk);
per GPU dtype and backend it prints the relative error of the first all-decode step's logits and of a
whole prompt's logits (one first chunk), and whether the step sequence matched the reference's.
`--kernel-later-chunks` runs chunks with cached context on the Triton kernel too (what the engine did
before engine/attention/triton_attention.py:later_chunks_on_torch): on an H100 with Triton 3.6 that gave
0.60 at budget 64 in bf16 against 0.02 for torch, exact in fp32.

    python benchmarks/gpu_attention_check.py [--kernel-later-chunks]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import engine.attention.triton_attention as triton_attention  # noqa: E402
from engine import EngineConfig, LLMEngine  # noqa: E402
from policies import Knobs  # noqa: E402
from tests.conftest import save_hf_model  # noqa: E402
from tests.test_cuda_engine import PROMPTS, decode_logits, free_gpu  # noqa: E402


def run(model: str, device: str, dtype: str, backend: str, budget: int):
    engine = LLMEngine(EngineConfig(model=model, device=device, dtype=dtype, attention_backend=backend,
                                    num_kv_blocks=256, cuda_graphs=False, knobs=Knobs(token_budget=budget)))
    steps = []
    engine.step_listeners.append(lambda r: steps.append((r.num_prefill_tokens, r.num_decode_tokens)))
    prompts = [[t % 990 + 5 for t in p] for p in PROMPTS[:5]]
    logits = decode_logits(engine, prompts).float().cpu()
    whole = engine.runner.prompt_logits(prompts[-1]).float().cpu()
    del engine
    if device == "cuda":
        free_gpu()
    return logits, whole, steps


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel-later-chunks", action="store_true",
                   help="chunks with cached context on the Triton kernel, as before the torch route")
    args = p.parse_args()
    if args.kernel_later_chunks:
        triton_attention.later_chunks_on_torch = lambda k_cache: False
    model = tempfile.mkdtemp()
    save_hf_model(model, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
    for budget in (64, 512):
        ref, ref_whole, ref_steps = run(model, "cpu", "fp32", "torch", budget)
        for dtype in ("fp32", "bf16"):
            for backend in ("torch", "triton"):
                start = time.perf_counter()
                logits, whole, steps = run(model, "cuda", dtype, backend, budget)
                print(f"budget {budget} {dtype} {backend}: decode-step error {relative(logits, ref):.4f}, "
                      f"prompt error {relative(whole, ref_whole):.4f}, same steps {steps == ref_steps} "
                      f"({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
