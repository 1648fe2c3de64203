from __future__ import annotations

import json
import re

import pytest

from autotuner.settings import SettingsError, load_settings
from tests.test_metrics_admin import NAMES


def test_default_config_file_loads():
    s = load_settings("configs/default.yaml", {"port": 9000, "policy": None})
    assert s.port == 9000 and s.policy == "deadline" and s.knob_values().token_budget == 2048
    assert s.slo_values().tbt_s == 0.25


@pytest.mark.parametrize("text,match", [
    ("bogus: 1", "unknown field 'bogus'"),
    ("port: eighty", "field 'port' must be int"),
    ("tune: 3", "field 'tune' must be bool"),
    ("knobs: {token_budget: 0}", "knobs: knob token_budget=0"),
    ("knobs: {budget: 10}", "knobs: "),
    ("policy: lifo", "unknown policy 'lifo'"),
    ("[1, 2]", "expected a mapping"),
    ("port: [", "not valid YAML"),
])
def test_bad_config_names_the_field(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(match)) as info:
        load_settings(str(path), {})
    assert "\n" not in str(info.value)


def test_grafana_dashboard_uses_exported_names():
    dashboard = json.load(open("configs/grafana-dashboard.json"))
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for name in ("num_requests_running", "kv_cache_usage_perc", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "knob"):
        assert f"autotuned:{name}" in exprs
    used = set(re.findall(r"autotuned:[a-z_]+", exprs))
    exported = {n for n in NAMES} | {"autotuned:step_tokens_total", "autotuned:request_success_total",
                                     "autotuned:model_flops_utilization", "autotuned:model_bandwidth_utilization",
                                     "autotuned:arrival_rate_rps", "autotuned:num_preemptions_total",
                                     "autotuned:device_sample", "autotuned:time_to_first_token_seconds_bucket",
                                     "autotuned:inter_token_latency_seconds_bucket",
                                     "autotuned:request_goodput_total"}
    assert used <= exported, used - exported
    # request-level series carry an slo_class label: panels must aggregate it away (or group by it)
    per_request = ("time_to_first_token", "inter_token_latency", "e2e_request", "request_success", "request_goodput")
    for expr in (t["expr"] for p in dashboard["panels"] for t in p["targets"]):
        if any(f"autotuned:{m}" in expr for m in per_request):
            assert "sum by (" in expr, expr


def test_slo_classes_setting_and_slo_retargeting_the_default_class(tmp_path):
    shipped = load_settings(None, {}).slo_class_values()
    assert set(shipped.classes) == {"interactive", "batch"} and shipped.get(None).ttft_s == 2.0
    path = tmp_path / "c.yaml"
    path.write_text("slo: {ttft_s: 3.0}\n")
    classes = load_settings(str(path), {}).api_config("m").slo_classes
    assert (classes.get(None).name, classes.get(None).ttft_s, classes.get(None).tbt_s) == ("interactive", 3.0, 0.25)
    assert classes.get("batch").ttft_s == 30.0          # only the default class is re-targeted
    own = tmp_path / "classes.yaml"
    own.write_text("default: fast\nclasses:\n  fast: {ttft_s: 0.5, tbt_s: 0.05}\n  slow: {ttft_s: 60, tbt_s: 5}\n")
    classes = load_settings(None, {"slo_classes": str(own), "slo": {"tbt_s": 0.1}}).api_config("m").slo_classes
    assert set(classes.classes) == {"fast", "slow"}
    assert (classes.get(None).ttft_s, classes.get(None).tbt_s, classes.get("slow").tbt_s) == (0.5, 0.1, 5)


@pytest.mark.parametrize("text,match", [
    (None, "cannot read SLO classes"),
    ("classes: [", "cannot read SLO classes"),
    ("classes: {a: {ttft_s: -1, tbt_s: 1}}", "ttft_s and tbt_s must be > 0"),
    ("classes: {a: {ttft_s: 1, tbt_s: 1, color: red}}", "color"),
    ("default: b\nclasses: {a: {ttft_s: 1, tbt_s: 1}}", "default SLO class 'b'"),
    ("classes: {}", "cannot read SLO classes"),
])
def test_bad_slo_classes_file_is_one_line(tmp_path, text, match):
    path = tmp_path / "classes.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(match)) as info:
        load_settings(None, {"slo_classes": str(path)})
    assert "\n" not in str(info.value) and str(info.value).startswith("slo_classes: ")


def test_serve_flag_names_the_slo_classes_file(tmp_path, capsys):
    from autotuner.cli import main

    assert main(["serve", "--slo-classes", str(tmp_path / "missing.yaml")]) == 2   # fails before loading a model
    err = capsys.readouterr().err.strip()
    assert err.startswith("autotuned-serve: error: slo_classes: cannot read SLO classes") and "\n" not in err
