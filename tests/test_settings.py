from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.settings import SettingsError, load_settings
from autotuner.tuner_service import TunerService
from serving.api_server import ApiConfig
from engine.engine_config import EngineConfig
from policies import Knobs
from tests.conftest import make_engine
from tests.live_server import LiveServer


def test_default_config_file_loads():
    s = load_settings("configs/default.yaml", {"port": 9000, "policy": None})
    assert s.port == 9000 and s.policy == "deadline" and s.knob_values().token_budget == 2048
    assert s.slo_values().tbt_s == 0.25
    assert s.engine_config().kv_cache_dtype == "auto" and s.engine_config().kv_cache_memory_mb == 256


@pytest.mark.parametrize("text,match", [
    ("bogus: 1", "unknown field 'bogus'"),
    ("port: eighty", "field 'port' must be int"),
    ("tune: 3", "field 'tune' must be bool"),
    ("knobs: {token_budget: 0}", "knobs: knob token_budget=0"),
    ("knobs: {budget: 10}", "knobs: "),
    ("policy: lifo", "unknown policy 'lifo'"),
    ("weights: int3", "unknown weights 'int3': expected auto, dense or quantized"),
    ("kv_cache_dtype: int4", "unknown kv_cache_dtype 'int4': expected auto, fp32, fp16 or bf16"),
    ("[1, 2]", "expected a mapping"),
    ("port: [", "not valid YAML"),
    ("calibration_budget_s: 0", "calibration_budget_s must be positive"),
    ("max_model_len: 0", "max_model_len must be positive"),
])
def test_bad_config_names_the_field(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(match)) as info:
        load_settings(str(path), {})
    assert "\n" not in str(info.value)


def test_the_calibration_budget_is_a_setting_and_a_flag(tmp_path):
    from serving.cli import build_parser

    assert load_settings(None, {}).calibration_budget_s == 60
    path = tmp_path / "budget.yaml"
    path.write_text("calibration_budget_s: 20\n")
    assert load_settings(str(path), {}).calibration_budget_s == 20
    args = build_parser().parse_args(["serve", "--calibration-budget-s", "5"])
    assert load_settings(str(path), {"calibration_budget_s": args.calibration_budget_s}).calibration_budget_s == 5


@pytest.fixture(scope="module")
def exposed(tiny_hf, tmp_path_factory) -> dict[str, set[str]]:
    """Sample name -> its label names, as the daemon's /metrics serves them (the engine's, the
    telemetry's and the tuner's metrics on one registry) after two requests and a device sample."""
    api = ApiConfig(served_model_name="tiny")
    config = DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11)
    telemetry = DaemonTelemetry(config)
    tuner = TunerService(str(tmp_path_factory.mktemp("state")), config.slo, telemetry.metrics.registry,
                         max_token_budget=256)
    load = lambda: telemetry.attach(make_engine(tiny_hf[0], token_budget=32))  # noqa: E731
    with LiveServer(load, api, extra_routes(telemetry, tuner)) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        for _ in range(2):                       # two arrivals: the arrival-rate gauge needs a gap
            client.completions.create(model="tiny", prompt="w5 w6 w7", max_tokens=4, extra_body={"ignore_eos": True})
        time.sleep(1.5)                          # the device sampler (1 s) sets MFU/MBU and device_sample
        text = httpx.get(server.url + "/metrics").text
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


CLUSTER_PANELS = ("Replicas:", "Router:")


def test_grafana_dashboard_uses_exposed_names(exposed):
    """Every series a panel queries is one the daemon exposes (with prometheus_client's _total and
    _bucket suffixes), with every label the panel selects or groups by."""
    dashboard = json.load(open("configs/grafana-dashboard.json"))
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]
             if not p["title"].startswith(CLUSTER_PANELS)]   # checked against a cluster's series in test_cluster_cli
    used = {name for expr in exprs for name in re.findall(r"autotuned:[a-z_]+", expr)}
    for name in ("num_requests_running", "kv_cache_usage_perc", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "knob"):
        assert f"autotuned:{name}" in used
    assert used <= set(exposed), sorted(used - set(exposed))
    for expr in exprs:
        series = re.findall(r"(autotuned:[a-z_]+)(\{[^}]*\})?", expr)
        labels = set().union(*(exposed[name] for name, _ in series))
        for name, selector in series:
            selected = set(re.findall(r"([a-z_]+)\s*[=!]~?", selector))
            assert selected <= exposed[name], (expr, selected - exposed[name])
        grouped = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
        assert grouped <= labels, (expr, grouped - labels)
        # request-level series carry an slo_class label: panels must aggregate it away (or group by it)
        if "slo_class" in labels:
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
    from serving.cli import main

    assert main(["serve", "--slo-classes", str(tmp_path / "missing.yaml")]) == 2   # fails before loading a model
    err = capsys.readouterr().err.strip()
    assert err.startswith("autotuned-serve: error: slo_classes: cannot read SLO classes") and "\n" not in err


def test_the_configuration_reference_and_default_yaml_are_rendered_from_the_code():
    """docs/configuration.md and configs/default.yaml are serving/config_reference.py's rendering of the
    settings, knobs and controller settings: a default changed in the code, or edited in either file
    by hand, fails here (`python -m serving.config_reference --write` re-renders them)."""
    from serving.config_reference import DEFAULT_YAML, REFERENCE, render_default_yaml, render_reference

    assert REFERENCE.read_text() == render_reference()
    assert DEFAULT_YAML.read_text() == render_default_yaml()


def test_every_setting_takes_its_default_from_the_dataclass_that_uses_it():
    """The settings pass on the engine's, API's and daemon's own defaults: nothing is restated."""
    from dataclasses import fields

    from serving.settings import DAEMON_KNOBS, Settings

    defaults = Settings()
    engine, api, daemon = defaults.engine_config(), defaults.api_config("m"), defaults.daemon_config("m")
    # the one deliberate difference: the daemon sheds load (DAEMON_KNOBS), the library engine admits everything
    fresh_engine = EngineConfig(knobs=Knobs(**DAEMON_KNOBS))
    fresh_api = ApiConfig(served_model_name="m")
    assert {f.name: getattr(engine, f.name) for f in fields(EngineConfig)} == \
        {f.name: getattr(fresh_engine, f.name) for f in fields(EngineConfig)}
    assert (api.max_waiting, api.max_body_bytes, api.default_max_tokens, api.engine_stall_s) == \
        (fresh_api.max_waiting, fresh_api.max_body_bytes, fresh_api.default_max_tokens, fresh_api.engine_stall_s)
    fresh_daemon = DaemonConfig(fresh_engine, fresh_api)
    for name in ("host", "port", "grace_s", "tune", "state_dir", "calibrate", "calibration_budget_s", "peak_flops"):
        assert getattr(daemon, name) == getattr(fresh_daemon, name), name
    assert load_settings("configs/default.yaml", {}).engine_config().knobs == fresh_engine.knobs


def test_every_setting_is_a_flag(tmp_path):
    """Each setting has its flag; --max-model-len, --max-num-seqs and --knob reach the engine, and a
    flag overrides only the knob it names in the file's knobs."""
    from dataclasses import fields

    from serving.cli import build_parser
    from serving.setting_flags import serve_overrides
    from serving.settings import Settings, flags

    help_text = build_parser().format_help()
    missing = [flag for f in fields(Settings) for flag in flags(f) if flag.split()[0] not in help_text]
    assert not missing
    path = tmp_path / "c.yaml"
    path.write_text("knobs: {token_budget: 256, step_headroom: 0.8}\nmax_model_len: 4096\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--max-num-seqs", "12", "--max-model-len",
                                      "1024", "--knob", "ttft_pace=2", "--slo-tbt-s", "0.4", "--no-tune"])
    s = load_settings(args.config, serve_overrides(args))
    knobs = s.engine_config().knobs
    assert (knobs.token_budget, knobs.max_num_seqs, knobs.step_headroom, knobs.ttft_pace) == (256, 12, 0.8, 2.0)
    assert s.engine_config().max_model_len == 1024 and s.tune is False
    assert s.slo_class_values().get(None).tbt_s == 0.4 and s.slo_class_values().get(None).ttft_s == 2.0


def test_max_model_len_is_the_models_limit_capped_or_what_was_asked_within_it():
    from engine.errors import ModelLoadError
    from engine.llm_engine import DEFAULT_MAX_MODEL_LEN, model_length_limit

    assert model_length_limit(None, 32768) == DEFAULT_MAX_MODEL_LEN
    assert model_length_limit(None, 2048) == 2048
    assert model_length_limit(16384, 32768) == 16384
    with pytest.raises(ModelLoadError, match="max_model_len 65536 must be between 1 and the model's limit 32768"):
        model_length_limit(65536, 32768)
