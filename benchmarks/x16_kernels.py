"""The interleaved kernels (engine/kernels/csrc/qlinear_x16.c) per GGUF type, on random weights, against the
machine's own read bandwidth (docs/cpu_kernels.md).

For each type: a cache-sized matrix (--rows x --cols, 4864 x 1536 by default: a 0.5B model's ffn_down
seen from the other side, a few MB) and a DRAM-sized one (--big-rows x --cols: a Qwen vocabulary's
output matrix, 130-250 MB), at each --batch row count: the best of --repeats calls, and for the big
matrix the bytes streamed per second, beside a torch sum over a 400 MB tensor (what the cores read).
At one row a decode step streams every weight once: the GB/s column says how close the kernel comes
to the memory's rate, and where it falls short the kernel's instructions are the limit.

    .venv/bin/python benchmarks/x16_kernels.py
    .venv/bin/python benchmarks/x16_kernels.py --types Q4_K Q6_K --batch 1 4 --json out/x16_kernels.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import bench_common  # noqa: F401  (imports engine before torch: OMP_WAIT_POLICY)
import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from bench_common import MachineInfo, emit_summary
from engine.kernels.quantized_linear import QuantizedTensor, best_time, load_kernels


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", nargs="+", default=["Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0"])
    p.add_argument("--rows", type=int, default=4864)
    p.add_argument("--big-rows", type=int, default=151936)
    p.add_argument("--cols", type=int, default=1536)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 64, 512])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=None)
    return p.parse_args()


def random_weights(qtype: GGMLQuantizationType, rows: int, cols: int) -> np.ndarray:
    """Random quants with small fp16 scales where each type keeps them (as tests/test_quantized_linear.py)."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    scale = rng.uniform(1e-4, 1e-3, raw.shape[:2]).astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    offset = size - 2 if qtype == GGMLQuantizationType.Q6_K else 0
    raw[:, :, offset:offset + 2] = scale
    if qtype in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K):
        raw[:, :, 2:4] = scale
    return raw.reshape(rows, -1)


def read_bandwidth_gb_s() -> float:
    big = torch.ones(100_000_000)
    return big.numel() * 4 / best_time(big.sum, 3, float("inf")) / 1e9


def render_doc(sources: list[Path]) -> str:
    """docs/cpu_kernels.md's table of the DRAM-sized matrices of a results file, and torch's read rate
    in the same run (benchmarks/render_docs.py)."""
    data = json.loads(sources[0].read_text())
    big = _dram_sized(data)
    batches = list(big[0]["seconds"])
    rows = ["| type | matrix | MB | " + " | ".join(f"{n} row{'s' * (n != '1')}, ms" for n in batches) + " | 1 row, GB/s |",
            "|---|---|---:|" + "---:|" * len(batches) + "---:|"]
    for r in big:
        times = " | ".join(_three_digits(r["seconds"][n] * 1e3) for n in batches)
        rows.append(f"| {r['type']} | {r['rows']} x {r['cols']} | {r['mb']:.0f} | {times} | {r['one_row_gb_s']:.1f} |")
    return "\n".join(rows) + f"\n\ntorch's sum over 400 MB in the same run: {data['read_gb_s']:.1f} GB/s."


def _three_digits(x: float) -> str:
    """5.93, 14.0, 713: three significant digits, trailing zeros kept."""
    return f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}"


def _dram_sized(data: dict) -> list[dict]:
    return [r for r in data["results"] if r["rows"] == max(x["rows"] for x in data["results"])]


def main() -> None:
    args = parse_args()
    kernels = load_kernels()
    if kernels is None:
        raise SystemExit("the CPU kernels are not built (pip install -e .)")
    read = read_bandwidth_gb_s()
    print(f"torch sum: {read:.1f} GB/s; kernels: {'AVX-512 VNNI' if kernels.avx512 else 'AVX2'}")
    print("| type | matrix | MB | " + " | ".join(f"{n} rows, ms" for n in args.batch) + " | 1 row, GB/s |")
    print("|---|---|---:|" + "---:|" * len(args.batch) + "---:|")
    rows_out = []
    for name in args.types:
        qtype = GGMLQuantizationType[name]
        for rows in (args.rows, args.big_rows):
            w = kernels.interleave(QuantizedTensor.from_numpy(int(qtype), rows, args.cols,
                                                              random_weights(qtype, rows, args.cols)))
            times = {}
            for n in args.batch:
                x, out = torch.randn(n, args.cols), torch.empty(n, rows)
                times[n] = best_time(lambda: kernels.matmul_into(w, x, out), args.repeats, float("inf"))
            gb_s = w.nbytes / times[args.batch[0]] / 1e9 if args.batch[0] == 1 else None
            rows_out.append({"type": name, "rows": rows, "cols": args.cols, "mb": w.nbytes / 1e6,
                             "seconds": times, "one_row_gb_s": gb_s})
            cells = " | ".join(f"{times[n] * 1e3:.3f}" for n in args.batch)
            print(f"| {name} | {rows} x {args.cols} | {w.nbytes / 1e6:.0f} | {cells} | "
                  f"{'' if gb_s is None else f'{gb_s:.1f}'} |")
            del w
    emit_summary({"machine": MachineInfo.collect().as_dict(), "read_gb_s": read, "results": rows_out}, args.json)


if __name__ == "__main__":
    main()
