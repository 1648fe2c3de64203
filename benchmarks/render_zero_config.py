"""Render the zero-config matrix (benchmarks/zero_config.py's JSON lines), its grid floor and the live
wrong starts (benchmarks/wrong_start_live.py's JSON) as the markdown tables of docs/tuning.md's rendered
block, and the matrix's one-line summary in README.md's. benchmarks/render_docs.py writes them into the
docs; tests/test_docs.py fails when a doc's tables and the results files disagree.

    python benchmarks/render_zero_config.py              # print the tables
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import results_file

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "zero_config.jsonl"
LIVE = ROOT / "docs" / "results" / "wrong_start_live.json"     # benchmarks/wrong_start_live.py
FLOOR = ROOT / "docs" / "results" / "zero_config_floor.jsonl"  # benchmarks/zero_config.py --grid-floor
NEAR_BEST = 0.98          # grid configurations serving at least this share of the best one's goodput
# the bars: tuned >= 0.97x best static after convergence, converged within 5 minutes, <= 2%
# of 30-s bins violating after it; a wrong start "loses" when left alone it serves 1.5x less
AFTER_MIN, CONVERGE_MAX_S, VIOLATING_MAX, LOSS_MIN = 0.97, 300.0, 0.02, 1.5
# The stored results predate the "30-s bins" names (re-running the benchmarks is out of scope), so
# their keys are read under the names the benchmarks write now.
STORED_KEYS = {"violating_after_convergence": "violating_bins_after_convergence",
               "best_static_violating_after_convergence": "best_static_violating_bins_after_convergence",
               "windows_met": "bins_met", "windows": "tuning_windows"}


def renamed(record: Any) -> Any:
    """`record` (a results file's JSON) with STORED_KEYS under their current names, at any depth."""
    if isinstance(record, list):
        return [renamed(r) for r in record]
    if not isinstance(record, dict):
        return record
    return {STORED_KEYS.get(k, k): renamed(v) for k, v in record.items()}


def load(path: Path = RESULTS) -> list[dict[str, Any]]:
    return [renamed(row) for row in results_file.read_lines(path)]


def violating(cell: dict[str, Any]) -> tuple[float, float]:
    """Shares of 30-s bins violating after convergence, tuned's and the best static's: over the
    requests that arrived after it where the cell records that (benchmarks/zero_config.py's `_new_arrivals`),
    else over every request finishing after it (which counts the wrong start's last requests); None for
    a cell that never converged (zero_config.py records no share then)."""
    key = "violating_bins_after_convergence"
    if key + "_new_arrivals" in cell:
        key += "_new_arrivals"
    return cell.get(key), cell.get("best_static_" + key)     # None where the cell never converged


def meets(cell: dict[str, Any], strict: bool = True) -> bool:
    """The three bars; `strict`: at most VIOLATING_MAX of 30-s bins violating, else at most that
    many more than the best static configuration violates over the same bins."""
    after, converged, (tuned, static) = cell["after_convergence_over_best_static"], cell["convergence_s"], violating(cell)
    if converged is None or converged > CONVERGE_MAX_S or after is None or after < AFTER_MIN:
        return False
    return tuned <= VIOLATING_MAX + (0 if strict else static)


def cell_text(cell: dict[str, Any]) -> str:
    if cell["convergence_s"] is None:
        return f"{cell['tuned_over_best_static']:.3f} / never"
    mark = "" if meets(cell) else " (†)" if meets(cell, strict=False) else " ✗"
    tuned, static = violating(cell)
    # where the share over new arrivals differs, the share over every finishing request follows it
    every = cell["violating_bins_after_convergence"]
    also = f" [{every:.0%} with earlier arrivals]" if every != tuned else ""
    return (f"{cell['after_convergence_over_best_static']:.3f} / {cell['convergence_s']:.0f} s / "
            f"{tuned:.0%} ({static:.0%}){also}{mark}")


def render(rows: list[dict[str, Any]]) -> str:
    """One row per (hardware, workload); each wrong start's cell ends with what it loses left alone."""
    starts = [c["start"] for c in rows[0]["cells"]]
    head = ["hardware", "workload", "rate (req/s)", "SLO (s)", "best static goodput (attainment)", *starts]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in rows:
        slo = f"{r['slo']['ttft_s']:g} / {r['slo']['tbt_s']:g}"
        lines.append(_row([r["hardware"], r["workload"], f"{r['qps']:.3g}", slo, best_static_text(r),
                           *(cell_text(c) + ("" if c["start"] == starts[0] else f"; alone {_loss(c['wrong_start_loss'])}")
                             for c in r["cells"])]))
    lines += ["", summary(rows)]
    return "\n".join(lines)


def best_static_text(row: dict[str, Any]) -> str:
    """Its goodput and SLO attainment; and, where the row records it, the share of the
    requests that miss the SLO even served alone on the idle machine."""
    alone = f"; {row['missed_alone']:.0%} missed alone" if "missed_alone" in row else ""
    return f"{row['best_static_goodput_rps']:.3g} ({row['best_static_slo_attainment']:.1%}{alone})"


def summary(rows: list[dict[str, Any]]) -> str:
    cells = [c for r in rows for c in r["cells"]]
    by_hw: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_hw.setdefault(r["hardware"], []).append(r)
    losing = {hw: max(c["wrong_start_loss"] for r in rs for c in r["cells"]) for hw, rs in by_hw.items()}
    relative = sum(meets(c, strict=False) and not meets(c) for c in cells)
    return (f"{sum(map(meets, cells))} of {len(cells)} cells meet all three bars (>= {AFTER_MIN}x after "
            f"convergence, within {CONVERGE_MAX_S:.0f} s, <= {VIOLATING_MAX:.0%} of 30-s bins violating after it), "
            f"{relative} more (†) where the best static configuration itself violates more bins and tuned "
            f"violates at most {VIOLATING_MAX:.0%} more than it; largest loss of a wrong start left alone per hardware: "
            + ", ".join(f"{hw} {_loss(loss)}" for hw, loss in losing.items()) + ".")


def _loss(value: float) -> str:
    return "∞" if value == float("inf") else f"{value:.2f}x"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render_live(live: dict[str, Any]) -> str:
    """The live daemon started from each wrong configuration, the tuner on."""
    head = ["start", "30-s bins meeting the SLO", "SLO met for good from", "SLO attainment", "goodput (req/s)",
            "tuning windows (violating)", "first tuning window ends at", "left alone: bins meeting the SLO, "
            "attainment, goodput"]
    lines = [f"Live, {live['machine']['cpu_model']} ({live['machine']['nproc']} cores), bundled SmolLM2, chat at "
             f"{live['qps']} req/s for {live['duration_s']:.0f} s ({live['num_requests']} requests), "
             f"SLO {live['slo']['ttft_s']} s / {live['slo']['tbt_s']} s, tuner on:", "", _row(head),
             _row(["---"] * len(head))]
    for name, r in live["results"].items():
        lines.append(_row([name + _carried(r), *_tuned(r), _left_alone(r.get("left_alone"))]))
    return "\n".join(lines)


def _tuned(run: dict[str, Any]) -> list[str]:
    """The tuned run's columns; a start run only with the tuner off (the defaults' reference): dashes."""
    if "controller" not in run:
        return ["-"] * 6
    c = run["controller"]
    first = f"{c['knobs'][0][0]:.0f} s" if c["knobs"] else "none"
    met = "never" if run["slo_met_again_s"] is None else f"{run['slo_met_again_s']:.0f} s"
    return [f"{sum(run['bins_met'])} of {len(run['bins_met'])}", met, f"{run['slo_attainment']:.1%}",
            f"{run['goodput_rps']:.3f}", f"{c['tuning_windows']} ({c['violating']})", first]


def _left_alone(run: dict[str, Any] | None) -> str:
    """The same start with the tuner off (wrong_start_live.py --left-alone); not run: a dash."""
    if run is None:
        return "-"
    return (f"{sum(run['bins_met'])} of {len(run['bins_met'])}, {run['slo_attainment']:.1%}, "
            f"{run['goodput_rps']:.3f}{_carried(run)}")


def _carried(run: dict[str, Any]) -> str:
    """Where a run carried over from an earlier run on the same requests came from (wrong_start_live.py --carry-from)."""
    return f" (earlier run, at {(run['carried_from']['commit'] or '?')[:7]})" if "carried_from" in run else ""


def render_floor(rows: list[dict[str, Any]]) -> str:
    """The criterion's floor: the static grid's configurations held from the first second, judged
    against the best one as a tuned run is (benchmarks/zero_config.py --grid-floor)."""
    head = ["hardware", "workload", f"grid configurations within {1 - NEAR_BEST:.0%} of the best",
            f"of them >= {AFTER_MIN}x after converging within {CONVERGE_MAX_S:.0f} s", "their convergence times"]
    lines = ["The criterion's floor: each configuration of the static grid held from the first second and judged "
             "against the best one as a tuned run is:", "", _row(head), _row(["---"] * len(head))]
    for r in rows:
        near = [g for g in r["grid_floor"] if g["over_best_static"] >= NEAR_BEST]
        passing = [g for g in near if g["convergence_s"] is not None and g["convergence_s"] <= CONVERGE_MAX_S
                   and g["after_convergence_over_best_static"] >= AFTER_MIN]
        times = ", ".join("never" if g["convergence_s"] is None else f"{g['convergence_s']:.0f} s" for g in near)
        lines.append(_row([r["hardware"], r["workload"], str(len(near)), str(len(passing)), times]))
    return "\n".join(lines)


def render_doc(sources: list[Path]) -> str:
    """docs/tuning.md's block: the matrix and its grid floor, and the live wrong starts where a third
    results file is given (benchmarks/render_docs.py)."""
    matrix, floor, *live = sources
    text = render(load(matrix)) + "\n\n" + render_floor(load(floor))
    return text + "".join("\n\n" + render_live(renamed(results_file.read(path))) for path in live)


def render_matrix(sources: list[Path]) -> str:
    """The matrix of one results file alone."""
    return render(load(sources[0]))


def render_shift(sources: list[Path]) -> str:
    """The matrix's rows of the shifting workload alone (docs/tuning.md, "The shifting workload")."""
    return render([r for r in load(sources[0]) if r["workload"] == "shift"])


def render_live_doc(sources: list[Path]) -> str:
    """One live run's table alone (docs/tuning.md: the wrong starts, one table per machine)."""
    return render_live(renamed(results_file.read(sources[0])))


def render_summary(sources: list[Path]) -> str:
    """README's line: how many cells meet the bars (benchmarks/render_docs.py)."""
    return summary(load(sources[0]))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    print(render_doc([RESULTS, FLOOR]) + "\n\n" + render_live_doc([LIVE]))


if __name__ == "__main__":
    main()
