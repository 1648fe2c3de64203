"""A prefill chunk's causal attention: the C kernel (engine/kernels/csrc/prefill_attention.c) against torch's
SDPA as the torch backend calls it (engine/attention/backends.py's _grouped_sdpa), on the attention shapes of
the models benchmarked against llama.cpp; median of --repeats calls each, alternating.

    .venv/bin/python benchmarks/prefill_attention.py --tokens 512 --json docs/results/prefill_attention.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import bench_common  # noqa: F401  (imports engine before torch: OMP_WAIT_POLICY)
import results_file
import torch

from bench_common import emit_summary
from engine.attention.backends import _grouped_sdpa
from engine.kernels.cpu_kernels import load_library

SHAPES = {"SmolLM2-135M": (9, 3, 64), "Qwen2.5-0.5B": (14, 2, 64), "Qwen2.5-1.5B": (12, 2, 128)}


@dataclass
class Timing:
    model: str
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int
    sdpa_ms: float
    kernel_ms: float

    @property
    def speedup(self) -> float:
        return self.sdpa_ms / self.kernel_ms


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=512, help="the chunk's queries, a first chunk (default 512)")
    p.add_argument("--repeats", type=int, default=21)
    p.add_argument("--json", default=None)
    return p.parse_args()


def measure(model: str, tokens: int, repeats: int) -> Timing:
    library = load_library()
    heads, kv_heads, dim = SHAPES[model]
    q = torch.randn(tokens, heads, dim)
    k, v = (torch.randn(tokens, kv_heads, dim).transpose(0, 1) for _ in range(2))   # [KVH, L, D] views
    scale = dim ** -0.5
    calls = {"sdpa": lambda: _grouped_sdpa(q, k, v, None, scale),
             "kernel": lambda: library.prefill_attention(q, k, v, 0, 0, None, scale)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return Timing(model, heads, kv_heads, dim, tokens, 1e3 * statistics.median(times["sdpa"]),
                  1e3 * statistics.median(times["kernel"]))


def markdown_table(rows: list[dict]) -> str:
    out = ["| model | heads / KV heads / head_dim | tokens | torch SDPA, ms | C kernel, ms | x |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        t = Timing(**r)
        out.append(f"| {t.model} | {t.heads} / {t.kv_heads} / {t.head_dim} | {t.tokens} | {t.sdpa_ms:.2f} | "
                   f"{t.kernel_ms:.2f} | **{t.speedup:.2f}** |")
    return "\n".join(out)


def render_doc(sources: list[Path]) -> str:
    """docs/cpu_kernels.md's table of a results file (benchmarks/render_docs.py)."""
    return markdown_table([r for s in sources for r in results_file.read(s)["results"]])


def main() -> None:
    args = parse_args()
    library = load_library()
    if library is None or not library.avx512:
        raise SystemExit("prefill_attention.py: the C kernel runs where the library's AVX-512 code does")
    rows = [asdict(measure(model, args.tokens, args.repeats)) for model in SHAPES]
    emit_summary({"results": rows}, args.json)
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
