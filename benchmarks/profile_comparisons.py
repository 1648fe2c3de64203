"""Published step times that are not checks of a hardware profile, next to its predictions: what a
profile does not claim to reproduce, and by how much it differs (docs/design/hardware_profiles.md).

- Splitwise's H100 Llama-2-70B rows (github.com/Mutinifni/splitwise-sim data/perf_model.csv, labelled
  TP2): absolute decode and prompt times, against h100-llama3.1-70b-tp4's calibration at TP2. The
  profiles check only their ratios.
- Niyama's fitted step-time model of the sarathi-serve engine on A100 + Llama-3-8B (facts sheet),
  against a100-mistral-7b (Mistral-7B has Llama-3-8B's layers; its LM head is 0.5 ms cheaper).

    python benchmarks/profile_comparisons.py                                        # print them
    python benchmarks/profile_comparisons.py --json docs/results/profile_comparisons.json   # and store them

benchmarks/render_docs.py renders the stored file (render_doc) into docs/design/hardware_profiles.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import results_file
from policies.step_shape import attended_pairs, context_tokens
from simulation.hardware_profile import Measure
from simulation.profile_checks import measure_ms
from simulation.profile_cost_model import ProfileCostModel

# (measure, published ms): decode token time averages 128 tokens after a 512-token prompt
SPLITWISE_H100_TP2 = (
    (Measure("decode", batch=1, context=576, tp=2), 37.0),
    (Measure("decode", batch=16, context=576, tp=2), 42.0),
    (Measure("decode", batch=32, context=576, tp=2), 52.3),
    (Measure("prefill", tokens=512, tp=2), 84.0),
    (Measure("prefill", tokens=2048, tp=2), 310.0),
    (Measure("prefill", tokens=8192, tp=2), 1340.0),
)
# Niyama (sarathi-serve branch niyama_asplos2026), seconds: b0, c_tot, c_p, c_d, c_dctx, c_pctx
NIYAMA = {"small": (0.014936, 5.882e-5, 2.248e-5, 3.635e-5, 1.111e-7, 7.555e-7),      # steps <= 512 tokens
          "large": (0.005004, 2.719e-5, 6.863e-5, -4.144e-5, 1.663e-7, 2.727e-6)}    # steps > 512 tokens
NIYAMA_SHAPES = ((0, 1, 100), (0, 32, 1024), (0, 64, 1024), (0, 128, 2000), (256, 32, 1024), (512, 0, 0),
                 (1024, 0, 0), (2048, 0, 0))       # (prefill tokens, decodes, context per decode)


def niyama_ms(prefill: int, decodes: int, decode_context: int) -> float:
    b0, c_tot, c_p, c_d, c_dctx, _ = NIYAMA["small" if prefill + decodes <= 512 else "large"]
    return 1e3 * (b0 + c_tot * (prefill + decodes) + c_p * prefill + c_d * decodes + c_dctx * decodes * decode_context)


def ours_ms(model: ProfileCostModel, prefill: int, decodes: int, decode_context: int) -> float:
    seqs = decodes + (1 if prefill else 0)     # each sequence samples: the prefill is a whole prompt at context 0
    context = decodes * context_tokens(1, decode_context) + context_tokens(prefill, 0)
    pairs = decodes * attended_pairs(1, decode_context) + attended_pairs(prefill, 0)
    return 1e3 * model.predict_counts(prefill, decodes, seqs, context, pairs, seqs)


def comparisons() -> list[dict[str, Any]]:
    """One row per published step: its source, what it is, the published and our milliseconds."""
    tp4 = ProfileCostModel.named("h100-llama3.1-70b-tp4")
    rows = []
    for measure, published in SPLITWISE_H100_TP2:
        what = f"decode, batch {measure.batch}" if measure.kind == "decode" else f"prompt, {measure.tokens} tokens"
        rows.append({"source": "Splitwise H100 Llama-2-70B TP2", "profile": "h100-llama3.1-70b-tp4 at TP2",
                     "step": what, "published_ms": published, "ours_ms": measure_ms(tp4, measure)})
    a100 = ProfileCostModel.named("a100-mistral-7b")
    for prefill, decodes, context in NIYAMA_SHAPES:
        what = f"prefill {prefill} + {decodes} decodes x {context} context"
        rows.append({"source": "Niyama's fitted sarathi-serve A100 Llama-3-8B", "profile": "a100-mistral-7b",
                     "step": what, "published_ms": niyama_ms(prefill, decodes, context),
                     "ours_ms": ours_ms(a100, prefill, decodes, context)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None, help="also store the rows here (results_file, with meta)")
    args = p.parse_args()
    rows = comparisons()
    for r in rows:
        print(f"{r['source']} vs {r['profile']}: {r['step']:<40} published {r['published_ms']:7.1f} ms  "
              f"ours {r['ours_ms']:7.1f} ms  published/ours {r['published_ms'] / r['ours_ms']:.2f}")
    if args.json:
        results_file.write(args.json, {"comparisons": rows})


def render_doc(sources: list[Path]) -> str:
    """docs/design/hardware_profiles.md's table (benchmarks/render_docs.py): the stored rows, one per step."""
    rows = results_file.read(sources[0])["comparisons"]
    lines = ["| source | step | profile | published (ms) | ours (ms) | published / ours |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['source']} | {r['step']} | {r['profile']} | {r['published_ms']:.1f} | "
                     f"{r['ours_ms']:.1f} | {r['published_ms'] / r['ours_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
