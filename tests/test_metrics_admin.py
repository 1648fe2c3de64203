"""/metrics in Prometheus text format with vLLM-style names, /admin with its key, telemetry windows."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from autotuner.daemon import DaemonConfig, Telemetry, extra_routes
from engine.api_server import ApiConfig
from engine.engine_config import EngineConfig
from telemetry.device_sampler import CpuReader, open_reader
from tests.conftest import make_engine
from tests.live_server import LiveServer

KEY = "s3cret"
NAMES = ["autotuned:num_requests_running", "autotuned:num_requests_waiting", "autotuned:kv_cache_usage_perc",
         "autotuned:time_to_first_token_seconds", "autotuned:inter_token_latency_seconds",
         "autotuned:e2e_request_latency_seconds", "autotuned:iteration_tokens_total", "autotuned:num_preemptions",
         "autotuned:knob", "autotuned:policy_info", "autotuned:request_success", "autotuned:input_output_token_ratio",
         "autotuned:request_goodput"]


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name="tiny", api_key=KEY)
    telemetry = Telemetry(DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11))
    load = lambda: telemetry.attach(make_engine(tiny_hf[0], token_budget=32))  # noqa: E731
    with LiveServer(load, api, extra_routes(telemetry)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        for i in range(4):
            client.completions.create(model="tiny", prompt=f"w{5 + i} w6 w7", max_tokens=6,
                                      extra_body={"ignore_eos": True})
        yield s


def test_metrics_parse_and_carry_the_names(server):
    text = httpx.get(server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in NAMES:
        assert name in families, name
    samples = {s.name: s for f in families.values() for s in f.samples}
    ttft_counts = {s.labels["slo_class"]: s.value for s in families["autotuned:time_to_first_token_seconds"].samples
                   if s.name.endswith("_count")}
    assert ttft_counts == {"interactive": 4}
    assert samples["autotuned:generation_tokens_total"].value == 24
    knobs = {s.labels["knob"]: s.value for s in families["autotuned:knob"].samples}
    assert knobs["token_budget"] == 32


def test_admin_needs_the_key(server):
    assert httpx.get(server.url + "/admin/scheduler").status_code == 401
    r = httpx.get(server.url + "/admin/scheduler", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_admin_sets_knobs_and_policy_and_rejects_bad_ones(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/admin/scheduler", headers=auth,
                   json={"policy": "adaptive", "knobs": {"token_budget": 48, "prefill_priority": 0.5}})
    assert r.status_code == 200 and r.json()["knobs"]["token_budget"] == 48
    bad = httpx.post(server.url + "/admin/scheduler", headers=auth, json={"knobs": {"token_budget": -3}})
    assert bad.status_code == 400 and "token_budget" in bad.json()["error"]["message"]
    bad = httpx.post(server.url + "/admin/scheduler", headers=auth, json={"policy": "nope"})
    assert bad.status_code == 400
    openai.OpenAI(base_url=server.url + "/v1", api_key="x").completions.create(model="tiny", prompt="w5", max_tokens=2)
    state = httpx.get(server.url + "/admin/scheduler", headers=auth).json()
    assert state["policy"] == "adaptive" and state["knobs"]["token_budget"] == 48
    text = httpx.get(server.url + "/metrics").text
    assert 'autotuned:policy_info{model_name="tiny",policy="adaptive"} 1.0' in text


def test_telemetry_window_summarises_recent_traffic(server):
    w = httpx.get(server.url + "/admin/telemetry?seconds=120", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert w["num_finished"] >= 4 and w["ttft_p50_s"] > 0 and w["output_tokens_per_s"] > 0
    assert w["input_output_ratio"] == pytest.approx(3 / 6, rel=0.5)
    assert 0 < w["mfu"] < 1 and 0 < w["mbu"] < 1


def nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:       # no package, no driver, no device
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(nvml_works(), reason="NVML is present here; tests/test_device_sampler.py fakes its absence")
def test_nvml_missing_degrades_to_cpu(caplog):
    """On this machine, with no NVIDIA driver: the real pynvml fails and the CPU reader takes over."""
    with caplog.at_level("INFO"):
        reader = open_reader("cuda")
    assert isinstance(reader, CpuReader)
    assert any("NVML unavailable" in m for m in caplog.messages)
    time.sleep(0.01)
    assert set(reader.read()) == {"cpu_util_perc", "cpu_load_1m"}


def test_slo_class_labels_reach_metrics(server):
    openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0).completions.create(
        model="tiny", prompt="w5 w6", max_tokens=3, extra_body={"ignore_eos": True, "slo_class": "batch"})
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}

    def by_class(family: str, suffix: str = "") -> dict[str, float]:
        return {s.labels["slo_class"]: s.value for s in families[family].samples if s.name == family + suffix}

    assert by_class("autotuned:e2e_request_latency_seconds", "_count")["batch"] == 1
    assert by_class("autotuned:inter_token_latency_seconds", "_count")["batch"] == 2
    assert by_class("autotuned:request_success", "_total")["batch"] == 1
    assert set(by_class("autotuned:request_goodput", "_total")) >= {"interactive", "batch"}


def test_goodput_counter_judges_each_request_by_its_class():
    from engine.outputs import RequestRecord
    from telemetry.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    for i, (cls, ttft, targets) in enumerate([("interactive", 1.0, (2.0, 0.25)), ("interactive", 5.0, (2.0, 0.25)),
                                              ("batch", 5.0, (30.0, 2.0)), ("batch", 40.0, (30.0, 2.0))]):
        metrics.on_finish(RequestRecord(str(i), 0.0, ttft, ttft + 0.1, (ttft, ttft + 0.1), 4, 2, 2, "length", 0,
                                        cls, *targets))
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    goodput = {s.labels["slo_class"]: s.value for s in families["autotuned:request_goodput"].samples
               if s.name.endswith("_total")}
    finished = {s.labels["slo_class"]: s.value for s in families["autotuned:request_success"].samples
                if s.name.endswith("_total")}
    assert goodput == {"interactive": 1, "batch": 1} and finished == {"interactive": 2, "batch": 2}
