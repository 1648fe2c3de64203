"""The cluster's command, settings and metric labels without Ray: the command line works where the
`cluster` extra is missing and says how to add it; bad cluster settings fail in one line."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.cli import MISSING_RAY
from cluster.cluster_spec import ClusterSpec
from serving.cli import main
from telemetry.constant_labels import labelled, render
from telemetry.prometheus import PrometheusMetrics


def test_without_ray_the_cluster_command_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)          # import ray -> ImportError
    assert main(["cluster", "--replicas", "2"]) == 2
    assert capsys.readouterr().err.strip() == f"autotuned-serve: error: {MISSING_RAY}"
    assert MISSING_RAY == "ray is not installed: pip install -e '.[cluster]'"


def test_bad_cluster_settings_fail_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown cluster field"):
        ClusterSpec.from_dict({"replica": 2})
    with pytest.raises(ValueError, match="router policy"):
        ClusterSpec.from_dict({"router": {"policy": "random"}})
    with pytest.raises(ValueError, match="replicas must be"):
        ClusterSpec(replicas=0)
    with pytest.raises(ValueError, match="unknown field 'polcy'"):
        ClusterSpec(settings={"polcy": "sarathi"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1]\n")
    with pytest.raises(ValueError, match="port"):
        ClusterSpec(config=str(bad))


def test_each_replica_gets_its_own_state_dir_and_label_and_shares_the_tuner_storage(tmp_path):
    spec = ClusterSpec.from_dict({"replicas": 3, "state_dir": str(tmp_path), "tuner_storage": "journal:/shared/j.log",
                                  "settings": {"tune": True, "kv_cache_memory_mb": 64}})
    configs = [spec.daemon_config(name) for name in spec.replica_names()]
    assert [c.state_dir for c in configs] == [str(tmp_path / f"replica-{i}") for i in range(3)]
    assert [c.metric_labels for c in configs] == [{"replica": f"replica-{i}"} for i in range(3)]
    assert {c.tuner_storage for c in configs} == {"journal:/shared/j.log"}
    assert [c.tuner_owner for c in configs] == spec.replica_names()
    assert all(c.engine.kv_cache_memory_mb == 64 for c in configs)


def test_replica_metrics_merge_into_one_valid_exposition():
    replicas = [PrometheusMetrics("m") for _ in range(2)]
    for i, m in enumerate(replicas):
        m.running.labels("m").set(i + 1)
        m.ttft.labels("m", "interactive").observe(0.1)
    text = render([f for i, m in enumerate(replicas)
                   for f in labelled(m.registry.collect(), {"replica": f"replica-{i}"})]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}   # parses: each family named once
    running = families["autotuned:num_requests_running"].samples
    assert {(s.labels["replica"], s.value) for s in running} == {("replica-0", 1.0), ("replica-1", 2.0)}
    assert text.count("# TYPE autotuned:num_requests_running gauge") == 1
    assert replicas[0].render() == render(replicas[0].registry.collect())   # no labels: as the single daemon


def cluster_series() -> dict[str, set[str]]:
    """Series names a cluster's /metrics can hold, with their labels: every daemon family with
    `replica` added, and the router's."""
    from cluster.router import Decision, Router
    from cluster.router_metrics import RouterMetrics

    router = RouterMetrics()
    router.on_decision(Decision("replica-0", "load", 0, 0), 0.001)
    router.on_loads(Router(["replica-0"]))
    router.retries.labels("replica-0").inc()
    router.failed.labels("replica-0").inc()
    series: dict[str, set[str]] = {}
    for family in router.registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    labels = {"model_name", "replica", "slo_class", "kind", "le", "knob", "metric", "policy", "finished_reason"}
    for family in PrometheusMetrics("m").registry.collect():   # (test_settings checks each family's own labels)
        for suffix in ("", "_total", "_bucket", "_sum", "_count"):
            series[family.name + suffix] = labels
    return series


def test_the_dashboard_cluster_panels_query_a_cluster_series():
    import json
    import re

    series = cluster_series()
    dashboard = json.load(open("configs/grafana-dashboard.json"))
    panels = [p for p in dashboard["panels"] if p["title"].startswith(("Replicas:", "Router:"))]
    assert len(panels) >= 6
    for expr in (t["expr"] for p in panels for t in p["targets"]):
        for name, selector in re.findall(r"(autotuned:[a-z_]+)(\{[^}]*\})?", expr):
            assert name in series, expr
            assert set(re.findall(r"([a-z_]+)\s*[=!]~?", selector)) <= series[name], expr
        grouped = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
        assert grouped <= set().union(*(series[n] for n, _ in re.findall(r"(autotuned:[a-z_]+)(\{[^}]*\})?", expr)))


def test_the_shipped_serve_config_builds_a_cluster_spec():
    import yaml

    config = yaml.safe_load(open("configs/serve-cluster.yaml"))
    (app,) = config["applications"]
    assert app["import_path"] == "cluster.app:build"
    args = app["args"]
    args["settings"] = {**args["settings"], "device": "cpu", "dtype": "fp32"}    # no GPU here
    spec = ClusterSpec.from_dict(args)
    assert spec.replicas == 4 and spec.replica_gpus == 1 and spec.router.max_imbalance_tokens == 8192
    assert spec.daemon_config("replica-3").state_dir == "/mnt/shared/autotuned/state/replica-3"


def test_the_cluster_flags_make_the_spec():
    from cluster.cli import spec_from_args
    from serving.cli import build_parser

    args = build_parser().parse_args(["cluster", "--replicas", "3", "--router", "round_robin", "--no-tune",
                                      "--no-calibrate", "--tuner-storage", "journal:/tmp/j", "--torch-threads", "1"])
    spec = spec_from_args(args)
    assert (spec.replicas, spec.router.policy, spec.tuner_storage, spec.torch_threads) == \
        (3, "round_robin", "journal:/tmp/j", 1)
    settings = spec.daemon_settings()
    assert settings.tune is False and settings.calibrate is False
