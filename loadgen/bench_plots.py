"""PNG plots of one bench run, from its raw per-request dicts (RequestResult.as_dict).

matplotlib's object API without pyplot: no global figure state and no display backend needed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def write_plots(requests: list[dict[str, Any]], out_dir: str, slo_ttft_s: float | None = None,
                slo_tbt_s: float | None = None) -> list[str]:
    """latency_cdf.png, tbt_over_time.png and throughput_over_time.png; returns their paths."""
    done = [r for r in requests if r["error"] is None]
    ttft = [r["first_token_s"] - r["sent_s"] for r in done if r["first_token_s"] is not None]
    gap_times, gaps = _gaps(done)
    end = max((r["finished_s"] or r["sent_s"] or 0.0 for r in requests), default=0.0)
    edges = np.linspace(0.0, max(end, 1e-3), 61)
    paths = []

    fig, (a1, a2) = _figure(2)
    _cdf(a1, ttft, "TTFT (s)", slo_ttft_s)
    _cdf(a2, gaps, "time between tokens (s)", slo_tbt_s)
    paths.append(_save(fig, out_dir, "latency_cdf.png"))

    fig, (ax,) = _figure(1)
    ax.scatter(gap_times, gaps, s=2, alpha=0.3, label="each gap")
    p99 = _binned(gap_times, gaps, edges, lambda v: float(np.percentile(v, 99)))
    ax.stairs(p99, edges, baseline=None, color="C3", label="P99 per bin")
    _mark(ax, requests, slo_tbt_s, "time since start (s)", "time between tokens (s)")
    paths.append(_save(fig, out_dir, "tbt_over_time.png"))

    fig, (a1, a2) = _figure(2)
    width = edges[1] - edges[0]
    token_t, token_w = _token_weights(done)
    a1.stairs(np.histogram(token_t, edges, weights=token_w)[0] / width, edges)
    _mark(a1, requests, None, "time since start (s)", "output tokens/s")
    sent = [r["sent_s"] for r in requests if r["sent_s"] is not None]
    a2.stairs(np.histogram(sent, edges)[0] / width, edges, label="sent")
    a2.stairs(np.histogram([r["finished_s"] for r in done], edges)[0] / width, edges, label="finished")
    _mark(a2, requests, None, "time since start (s)", "requests/s")
    paths.append(_save(fig, out_dir, "throughput_over_time.png"))
    return paths


def _figure(rows: int) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(8, 3.2 * rows), layout="constrained")
    return fig, list(fig.subplots(rows, 1, squeeze=False)[:, 0])


def _save(fig: Figure, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=100)
    return path


def _gaps(done: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    times, gaps = [], []
    for r in done:
        t = r["chunk_times_s"]
        times += t[1:]
        gaps += [b - a for a, b in zip(t, t[1:])]
    return times, gaps


def _token_weights(done: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Each chunk weighted by the tokens it carried on average, so sums match usage counts."""
    times, weights = [], []
    for r in done:
        t = r["chunk_times_s"]
        times += t
        weights += [r["num_output_tokens"] / len(t)] * len(t) if t else []
    return times, weights


def _binned(times: list[float], values: list[float], edges: np.ndarray, stat) -> list[float]:
    idx = np.digitize(times, edges) - 1
    v = np.asarray(values)
    return [stat(v[idx == i]) if np.any(idx == i) else np.nan for i in range(len(edges) - 1)]


def _cdf(ax: Axes, values: list[float], xlabel: str, slo: float | None) -> None:
    if values:
        x = np.sort(values)
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post")
    if slo is not None:
        ax.axvline(slo, color="C3", linestyle="--", label=f"SLO {slo:g} s")
        ax.legend(loc="lower right")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction")
    ax.grid(alpha=0.3)


def _mark(ax: Axes, requests: list[dict[str, Any]], slo: float | None, xlabel: str, ylabel: str) -> None:
    """Axis labels, the SLO line and dotted lines where the workload changes phase."""
    ordered = sorted((r for r in requests if r["sent_s"] is not None), key=lambda r: r["sent_s"])
    phase = lambda r: r["phase"].split("/")[0]  # noqa: E731  (a phase's concurrent streams read phase/stream)
    for prev, r in zip(ordered, ordered[1:]):
        if phase(r) != phase(prev):
            ax.axvline(r["sent_s"], color="gray", linestyle=":")
            ax.annotate(phase(r), (r["sent_s"], 0.98), xycoords=("data", "axes fraction"), fontsize=8,
                        rotation=90, ha="right", va="top", color="gray")
    if slo is not None:
        ax.axhline(slo, color="C3", linestyle="--", label=f"SLO {slo:g} s")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left")
