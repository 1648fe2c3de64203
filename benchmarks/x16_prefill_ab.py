"""Two builds of the CPU kernel library side by side on a prefill step's matmuls (#31): per GGUF type, the four
projections of a transformer layer at --rows activation rows (a 512-token prefill chunk) on random weights, each
library in its own process (`python -P`, $AUTOTUNED_SERVE_CPU_KERNELS), the two alternating for --rounds rounds;
the medians and the ratio. The 32-column types take a Qwen2.5 0.5B's shapes, the K-quants (256 columns a block)
a 1.5B's.

    git worktree add /tmp/before <commit> && (cd /tmp/before && python setup.py -q build_ext -b /tmp/before/lib)
    .venv/bin/python benchmarks/x16_prefill_ab.py --before /tmp/before/lib/engine/kernels/_cpu_kernels*.so \\
        --types Q4_0 Q4_1 Q5_0 Q4_K Q6_K --json /tmp/ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (rows, cols) of a layer's fused qkv, o, fused gate/up and down projections
SHAPES = {"0.5b": [(1152, 896), (896, 896), (9728, 896), (896, 4864)],
          "1.5b": [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="the library to compare against (a build of an earlier commit); required")
    p.add_argument("--after", default=None, help="default: this tree's engine/kernels library")
    p.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--time-one", nargs=2, metavar=("TYPE", "SHAPES"), help=argparse.SUPPRESS)  # the child's work
    return p.parse_args()


def time_layer(qtype_name: str, shapes: str, rows: int, repeats: int) -> float:
    """Seconds for one layer's four matmuls (each the best of `repeats` calls), in this process's library."""
    sys.path.insert(0, str(ROOT / "benchmarks"))   # run with -P: the script's folder is not on the path
    import bench_common  # noqa: F401  (engine before torch)
    import torch
    from gguf import GGMLQuantizationType
    from engine.kernels.quantized_linear import QuantizedTensor, best_time, load_kernels
    from x16_kernels import random_weights
    kernels, qtype, total = load_kernels(), GGMLQuantizationType[qtype_name], 0.0
    for out_rows, cols in SHAPES[shapes]:
        w = kernels.interleave(QuantizedTensor.from_numpy(int(qtype), out_rows, cols, random_weights(qtype, out_rows, cols)))
        x, out = torch.randn(rows, cols), torch.empty(rows, out_rows)
        total += best_time(lambda: kernels.matmul_into(w, x, out), repeats, float("inf"))
    return total


def shapes_of(qtype_name: str) -> str:
    return "1.5b" if qtype_name.endswith("_K") else "0.5b"


def run_child(library: str, qtype_name: str, args: argparse.Namespace) -> float:
    env = dict(os.environ, AUTOTUNED_SERVE_CPU_KERNELS=library)
    cmd = [sys.executable, "-P", __file__, "--rows", str(args.rows), "--repeats",
           str(args.repeats), "--time-one", qtype_name, shapes_of(qtype_name)]
    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def default_library() -> str:
    from engine.kernels.cpu_kernels import library_path
    path = library_path()
    if path is None:
        raise SystemExit("the CPU kernels are not built (pip install -e .)")
    return path


def render_doc(sources: list[Path]) -> str:
    """docs/llama_cpp.md's table: per type, the median layer time of each build and the ratio."""
    data = json.loads(sources[0].read_text())
    rows = [f"| type | shapes | {data['rows']} rows, ms a layer: before / after | after over before |",
            "|---|---|---|---:|"]
    for r in data["results"]:
        rows.append(f"| {r['type']} | {r['shapes']} | {r['before_ms']:.2f} / {r['after_ms']:.2f} | "
                    f"**{r['before_ms'] / r['after_ms']:.2f}x** |")
    return "\n".join(rows)


def main() -> None:
    args = parse_args()
    if args.time_one:
        print(time_layer(*args.time_one, args.rows, args.repeats))
        return
    if args.before is None:
        raise SystemExit("x16_prefill_ab: --before LIBRARY is required")
    from bench_common import MachineInfo, emit_summary
    after = args.after or default_library()
    results = []
    for name in args.types:
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for side, library in (("before", args.before), ("after", after)):
                times[side].append(run_child(library, name, args) * 1e3)
        before, after_ms = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"{name}: {before:.2f} / {after_ms:.2f} ms a layer ({before / after_ms:.3f}x)", flush=True)
        results.append({"type": name, "shapes": shapes_of(name), "before_ms": before, "after_ms": after_ms,
                        "rounds_ms": times})
    emit_summary({"machine": MachineInfo.collect().as_dict(), "rows": args.rows, "before": args.before,
                  "after": after, "results": results}, args.json)


if __name__ == "__main__":
    main()
