"""Render the zero-config matrix (benchmarks/zero_config.py's JSON lines) as the markdown tables in
docs/tuning.md, between its `<!-- zero_config:begin -->` and `<!-- zero_config:end -->` markers.
tests/test_docs.py fails when the doc's tables and the results file disagree.

    python benchmarks/render_zero_config.py              # rewrite the block in docs/tuning.md
    python benchmarks/render_zero_config.py --print      # print the tables only
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "zero_config.jsonl"
DOC = ROOT / "docs" / "tuning.md"
BEGIN, END = "<!-- zero_config:begin -->", "<!-- zero_config:end -->"
# the bars: tuned >= 0.97x best static after convergence, converged within 5 minutes, <= 2%
# of 30-s windows violating after it; a wrong start "loses" when left alone it serves 1.5x less
AFTER_MIN, CONVERGE_MAX_S, VIOLATING_MAX, LOSS_MIN = 0.97, 300.0, 0.02, 1.5


def load(path: Path = RESULTS) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def meets(cell: dict[str, Any]) -> bool:
    after, converged, violating = (cell["after_convergence_over_best_static"], cell["convergence_s"],
                                   cell["violating_after_convergence"])
    return (converged is not None and converged <= CONVERGE_MAX_S and after is not None and after >= AFTER_MIN
            and violating <= VIOLATING_MAX)


def cell_text(cell: dict[str, Any]) -> str:
    if cell["convergence_s"] is None:
        return f"{cell['tuned_over_best_static']:.3f} / never"
    mark = "" if meets(cell) else " ✗"
    return (f"{cell['after_convergence_over_best_static']:.3f} / {cell['convergence_s']:.0f} s / "
            f"{cell['violating_after_convergence']:.0%}{mark}")


def render(rows: list[dict[str, Any]]) -> str:
    starts = [c["start"] for c in rows[0]["cells"]]
    head = ["hardware", "workload", "rate (req/s)", "best static goodput (attainment)", *starts]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in rows:
        lines.append(_row([r["hardware"], r["workload"], f"{r['qps']:.3g}",
                           f"{r['best_static_goodput_rps']:.3g} ({r['best_static_slo_attainment']:.1%})",
                           *(cell_text(c) for c in r["cells"])]))
    lines += ["", "What each start loses when left alone (best static goodput / the start's own):", ""]
    wrong = starts[1:]
    lines += [_row(["hardware", "workload", *wrong]), _row(["---"] * (2 + len(wrong)))]
    for r in rows:
        losses = {c["start"]: c["wrong_start_loss"] for c in r["cells"]}
        lines.append(_row([r["hardware"], r["workload"], *(_loss(losses[s]) for s in wrong)]))
    lines += ["", summary(rows)]
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    cells = [c for r in rows for c in r["cells"]]
    by_hw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_hw.setdefault(r["hardware"], []).append(r)
    losing = {hw: max(c["wrong_start_loss"] for r in rs for c in r["cells"]) for hw, rs in by_hw.items()}
    return (f"{sum(map(meets, cells))} of {len(cells)} cells meet all three bars (>= {AFTER_MIN}x after "
            f"convergence, within {CONVERGE_MAX_S:.0f} s, <= {VIOLATING_MAX:.0%} of windows violating after it); "
            "largest loss of a wrong start left alone per hardware: "
            + ", ".join(f"{hw} {loss:.2f}x" for hw, loss in losing.items()) + ".")


def _loss(value: float) -> str:
    return "∞" if value == float("inf") else f"{value:.2f}x"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def block(text: str) -> str:
    """The rendered block of a doc (between the markers)."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"{DOC}: no {BEGIN} ... {END} block")
    return match.group(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--print", action="store_true", help="print the tables instead of rewriting docs/tuning.md")
    args = p.parse_args()
    tables = render(load())
    if args.print:
        print(tables)
        return
    text = DOC.read_text()
    DOC.write_text(text.replace(block(text), tables))


if __name__ == "__main__":
    main()
