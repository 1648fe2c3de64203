"""Why the Triton prefill kernel gets chunks with cached context wrong inside the engine on a GPU (docs/gpu.md).

The engine of benchmarks/gpu_attention_check.py (a small random Llama, 8 query / 2 KV heads of 64 dims, bf16,
a 64-token budget, so prompts are chunked beside decodes) serves its prompts on the production route (chunks
with cached context on torch). At every layer of every step that has such chunks, the same inputs also go
through the prefill kernel under several launch variants, and each variant's output rows for those chunks
are compared with the production rows: the relative error per variant (worst and median over the calls),
and the first failing call's inputs saved for replay.

Variants: the default launch; num_stages 1 and 2 (software pipelining of the key loop); num_warps 8; 16-row or
16-key tiles; the chunk launched alone (first_seq at the chunk); q made contiguous; fp32 dots ("ieee", the exact case).

    python benchmarks/gpu_chunk_kernel_check.py [--json OUT.json] [--save-case CASE.pt]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import engine.attention.triton_attention as triton_attention  # noqa: E402
from engine import EngineConfig, LLMEngine  # noqa: E402
from engine.kernels import triton_kernels as tk  # noqa: E402
from policies import Knobs  # noqa: E402
from tests.conftest import save_hf_model  # noqa: E402
from tests.test_cuda_engine import PROMPTS, decode_logits  # noqa: E402

VARIANTS = {   # name: (launch options, chunk alone, contiguous q, fp32 dots)
    "default": ({}, False, False, False),
    "stages1": ({"num_stages": 1}, False, False, False),
    "stages2": ({"num_stages": 2}, False, False, False),
    "warps8": ({"num_warps": 8}, False, False, False),
    "block_m16": ({"BLOCK_M": 16}, False, False, False),
    "block_n16": ({"BLOCK_N": 16}, False, False, False),
    "alone": ({}, True, False, False),
    "contiguous_q": ({}, False, True, False),
    "fp32_dots": ({}, False, False, True),
}


def launch(q, k_cache, v_cache, meta, scale: float, first_seq: int, num_seqs: int, options: dict,
           fp32: bool) -> torch.Tensor:
    """varlen_prefill's launch with extra launch options; fp32: upcast q and the caches (IEEE dots)."""
    if fp32:
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    out = torch.zeros_like(q)
    num_heads, head_dim = q.shape[1], q.shape[2]
    options = {"BLOCK_M": tk.PREFILL_BLOCK_M, "BLOCK_N": tk.PREFILL_BLOCK_N} | options
    grid = (num_seqs, num_heads, -(-meta.max_query_len // options["BLOCK_M"]))
    tk._prefill_kernel[grid](
        q, out, k_cache, v_cache, meta.block_tables, meta.query_starts, meta.query_lens, meta.context_lens, first_seq,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
        meta.block_tables.stride(0), scale * tk.LOG2E, GROUP=num_heads // k_cache.shape[1],
        BLOCK_SIZE=meta.block_size, HEAD_DIM=head_dim,
        BLOCK_D=tk._block_d(head_dim), DOT_PRECISION=tk._dot_precision(k_cache.dtype),
        NATIVE_DOT=tk._native_dot(q, k_cache), FIRST_CHUNKS_ONLY=False, **options)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--json")
    p.add_argument("--save-case")
    args = p.parse_args()
    errors: dict[str, list[float]] = {name: [] for name in VARIANTS}
    calls: list[dict] = []
    production = triton_attention.TritonAttention.attend

    def checked_attend(self, q, k, v, k_cache, v_cache, meta):
        out = production(self, q, k, v, k_cache, v_cache, meta)
        later = meta.later_chunks(q.device) if meta.num_prefills else []
        if not later:
            return out
        rows = torch.cat([torch.arange(c.query_start, c.query_start + c.query_len, device=q.device) for c in later])
        want = out[rows].float()
        call = {"chunks": [(c.query_start, c.query_len, c.context_len) for c in later],
                "num_decodes": meta.num_decodes, "num_prefills": meta.num_prefills}
        for name, (options, alone, contiguous, fp32) in VARIANTS.items():
            qq = q.contiguous() if contiguous else q
            if alone:   # each later chunk in its own launch
                got = torch.zeros_like(q, dtype=torch.float32)
                for c in later:
                    seq = int((meta.query_starts == c.query_start).nonzero()[0, 0])
                    got += launch(qq, k_cache, v_cache, meta, self.scale, seq, 1, options, fp32).float()
            else:
                got = launch(qq, k_cache, v_cache, meta, self.scale, meta.num_decodes, meta.num_prefills, options,
                             fp32).float()
            err = float((got[rows] - want).norm() / want.norm())
            errors[name].append(err)
            call[name] = round(err, 4)
        calls.append(call)
        if args.save_case and call["default"] > 0.1 and not Path(args.save_case).exists():
            torch.save({"q": q, "k_cache": k_cache, "v_cache": v_cache, "scale": self.scale, "want_rows": rows,
                        "want": want, **{f: getattr(meta, f) for f in ("block_tables", "query_starts", "query_lens",
                                                                         "context_lens", "seq_lens")},
                        "num_decodes": meta.num_decodes, "num_prefills": meta.num_prefills,
                        "max_query_len": meta.max_query_len, "block_size": meta.block_size}, args.save_case)
        return out

    triton_attention.TritonAttention.attend = checked_attend
    model = tempfile.mkdtemp()
    save_hf_model(model, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=1024, initializer_range=0.05)
    dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    engine = LLMEngine(EngineConfig(model=model, device=args.device, dtype=dtype, attention_backend="triton",
                                    num_kv_blocks=256, cuda_graphs=False, knobs=Knobs(token_budget=64)))
    decode_logits(engine, [[t % 990 + 5 for t in p] for p in PROMPTS[:5]])
    summary = {name: {"worst": max(e), "median": statistics.median(e), "over_0.1": sum(x > 0.1 for x in e)}
               for name, e in errors.items() if e}
    for name, s in summary.items():
        print(f"{name:>13}: worst {s['worst']:.4f}, median {s['median']:.4f}, {s['over_0.1']} of "
              f"{len(errors[name])} layer calls over 0.1")
    for call in calls[:: max(1, len(calls) // 12)]:
        print(call)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(torch.cuda.get_device_name()) if dtype == "bf16"
                                               else "cpu", "summary": summary, "calls": calls}, indent=1))


if __name__ == "__main__":
    main()
