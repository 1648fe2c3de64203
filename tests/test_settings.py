from __future__ import annotations

import json
import re

import pytest

from autotuner.settings import SettingsError, load_settings
from tests.test_metrics_admin import NAMES


def test_default_config_file_loads():
    s = load_settings("configs/default.yaml", {"port": 9000, "policy": None})
    assert s.port == 9000 and s.policy == "sarathi" and s.knob_values().token_budget == 512
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
                                     "autotuned:inter_token_latency_seconds_bucket"}
    assert used <= exported, used - exported
