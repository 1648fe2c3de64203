"""docs/metrics.md's table of the daemon's Prometheus series, rendered from the collectors the daemon
registers (telemetry/prometheus.py, autotuner/tuner_service.py), so the page cannot name a series the
code does not serve: tests/test_docs.py fails when the table is stale.

    python -m serving.metrics_reference --write     # re-render the table in docs/metrics.md
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from autotuner.tuner_service import TunerMetrics
from telemetry.prometheus import PrometheusMetrics

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "metrics.md"
BEGIN = "<!-- rendered by `python -m serving.metrics_reference --write` from the daemon's collectors -->"
END = "<!-- end rendered -->"
EXPOSED_SUFFIX = {"counter": "_total", "histogram": "_bucket / _sum / _count"}


@dataclass(frozen=True)
class Series:
    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    source: str


def daemon_series() -> list[Series]:
    """Every series a daemon's /metrics holds under `autotuned:`, in the order the code registers them."""
    registry = CollectorRegistry()
    engine = PrometheusMetrics("MODEL", registry=registry)
    owners = [(engine, "engine"), (engine.structured, "engine"), (engine.admission, "engine"),
              (engine.speculation, "engine"), (TunerMetrics(registry), "tuner")]
    return [Series(m._name, m._type, tuple(m._labelnames), m._documentation, source)
            for owner, source in owners for m in vars(owner).values() if isinstance(m, MetricWrapperBase)]


def render_table() -> str:
    rows = ["| series | type | labels | what it counts | from |", "|---|---|---|---|---|"]
    for s in daemon_series():
        suffix = EXPOSED_SUFFIX.get(s.kind, "")
        name = f"`{s.name}{suffix}`" if s.kind != "histogram" else f"`{s.name}` ({suffix})"
        labels = ", ".join(f"`{label}`" for label in s.labels) or "-"
        rows.append(f"| {name} | {s.kind} | {labels} | {s.help.replace('|', '/')} | {s.source} |")
    return "\n".join(rows)


def rendered_page(text: str) -> str:
    block = re.compile(re.escape(BEGIN) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    if not block.search(text):
        raise ValueError(f"{PAGE.relative_to(ROOT)} has no block opening with {BEGIN}")
    return block.sub(lambda _: f"{BEGIN}\n{render_table()}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="re-render the table (default: check it)")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    fresh = rendered_page(text)
    if args.write:
        PAGE.write_text(fresh)
        return 0
    if fresh != text:
        print(f"{PAGE.relative_to(ROOT)} is stale: python -m serving.metrics_reference --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
