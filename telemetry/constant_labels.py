"""Metric families with constant labels added (a replica's `replica="replica-0"`), and merging the
families of several processes into one exposition.

prometheus_client has no constant labels, and PrometheusMetrics' label lists are what the single
daemon's dashboards query: the labels are added at render time instead, so a daemon without any
renders exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample


def labelled(families: Iterable[Metric], labels: dict[str, str]) -> list[Metric]:
    """Copies of the families whose every sample also carries `labels`."""
    out = []
    for family in families:
        copy = Metric(family.name, family.documentation, family.type, family.unit)
        copy.samples = [Sample(s.name, {**s.labels, **labels}, s.value, s.timestamp, s.exemplar)
                        for s in family.samples]
        out.append(copy)
    return out


def merged(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, holding the samples of every family of that name (from several
    replicas, told apart by their labels): an exposition may name each family only once."""
    by_name: dict[str, Metric] = {}
    for family in families:
        into = by_name.get(family.name)
        if into is None:
            into = by_name[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
        into.samples.extend(family.samples)
    return list(by_name.values())


class Families:
    """A collector of fixed families, for generate_latest."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def render(families: Iterable[Metric]) -> bytes:
    return generate_latest(Families(merged(families)))   # type: ignore[arg-type]
