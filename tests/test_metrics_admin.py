"""/metrics in Prometheus text format with vLLM-style names, /admin with its key, telemetry windows."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.api_server import ApiConfig
from engine.engine_config import EngineConfig
from engine.model_config import ModelConfig
from engine.outputs import StepRecord
from telemetry.device_sampler import CpuReader, open_reader
from telemetry.hardware import DevicePeaks
from telemetry.model_cost import ModelCost
from telemetry.model_shape import ModelShape
from telemetry.window import TelemetryWindow
from tests.conftest import make_engine
from tests.live_server import LiveServer

KEY = "s3cret"
NAMES = ["autotuned:num_requests_running", "autotuned:num_requests_waiting", "autotuned:kv_cache_usage_perc",
         "autotuned:time_to_first_token_seconds", "autotuned:inter_token_latency_seconds",
         "autotuned:e2e_request_latency_seconds", "autotuned:iteration_tokens_total", "autotuned:num_preemptions",
         "autotuned:knob", "autotuned:policy_info", "autotuned:request_success", "autotuned:input_output_token_ratio",
         "autotuned:request_goodput", "process_resident_memory_bytes", "process_start_time_seconds"]
STEPS: list[StepRecord] = []      # every step of the module's server


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name="tiny", api_key=KEY)
    telemetry = DaemonTelemetry(DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11))

    def load():
        engine = telemetry.attach(make_engine(tiny_hf[0], token_budget=32))
        engine.step_listeners.append(STEPS.append)
        return engine

    with LiveServer(load, api, extra_routes(telemetry)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key=KEY, max_retries=0)
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


def test_state_gauges_are_read_when_scraped(server):
    """A client that goes away mid-stream is aborted between steps: its KV is freed with no step after it
    to record that, and a drained daemon must not go on showing it in use (the soak reads KV after its drain)."""
    body = {"model": "tiny", "prompt": "w8 w9", "max_tokens": 200, "stream": True, "ignore_eos": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=auth) as r:
        next(r.iter_lines())
    deadline = time.monotonic() + 10
    while server.state.loop.num_unfinished:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert STEPS[-1].kv_usage > 0                       # what the last step recorded: the request's blocks
    values = {f.name: f.samples[0].value for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
              if f.name in ("autotuned:num_requests_running", "autotuned:num_requests_waiting",
                            "autotuned:kv_cache_usage_perc")}
    assert values == {"autotuned:num_requests_running": 0, "autotuned:num_requests_waiting": 0,
                      "autotuned:kv_cache_usage_perc": 0}


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
    openai.OpenAI(base_url=server.url + "/v1", api_key=KEY).completions.create(model="tiny", prompt="w5", max_tokens=2)
    state = httpx.get(server.url + "/admin/scheduler", headers=auth).json()
    assert state["policy"] == "adaptive" and state["knobs"]["token_budget"] == 48
    text = httpx.get(server.url + "/metrics").text
    assert 'autotuned:policy_info{model_name="tiny",policy="adaptive"} 1.0' in text


def flops_and_bytes(model: torch.nn.Module, config: ModelConfig, step: StepRecord,
                    kv_bytes: int = 4) -> tuple[float, float]:
    """One step's FLOPs and bytes counted from the engine's own modules: 2 FLOPs per weight of every
    decoder-layer linear per token, the LM head per sampled row, 2 x 2 x head_dim per head for each
    attended (query, key) pair (QK^T and PV); every weight read once, K and V of every attended and
    new token read or written (kv_bytes per element: 2 for the CPU's default fp16 cache)."""
    layers = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear))
    head = model.lm_head.weight.numel()
    tokens = step.num_prefill_tokens + step.num_decode_tokens
    flops = 2 * tokens * layers + 2 * step.num_sampled * head + 4 * config.num_layers * config.num_heads \
        * config.head_dim * step.attended_pairs
    kv = 2 * config.num_layers * config.num_kv_heads * config.head_dim * kv_bytes
    return flops, (layers + head) * 4 + kv * (step.context_tokens + tokens)


def test_telemetry_window_summarises_recent_traffic(server):
    """MFU and MBU over the window: every step's FLOPs and bytes (counted from the engine's modules)
    over the window's length times the configured peaks (1 TFLOP/s, 100 GB/s)."""
    w = httpx.get(server.url + "/admin/telemetry?seconds=120", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert w["num_finished"] >= 4 and w["ttft_p50_s"] > 0 and w["output_tokens_per_s"] > 0
    assert w["input_output_ratio"] == pytest.approx(3 / 6, rel=0.5)
    engine = server.engine
    assert STEPS and STEPS[0].start >= time.monotonic() - 120            # every step is in the window
    kv_bytes = engine.runner.kv_cache.element_size()
    counts = [flops_and_bytes(engine.runner.model, engine.model_config, s, kv_bytes) for s in STEPS]
    assert w["mfu"] == pytest.approx(sum(f for f, _ in counts) / (120 * 1e12), rel=1e-9)
    assert w["mbu"] == pytest.approx(sum(b for _, b in counts) / (120 * 1e11), rel=1e-9)


def test_mfu_of_a_known_step():
    """The tiny Llama (hidden 64, MLP 128, 2 layers, 4 heads of 16, 2 KV heads, vocab 300): a
    3-token prefill of one request computes 2 x 3 x 73,728 (layer weights: 64 x 128 QKV + 64 x 64 O
    + 3 x 64 x 128 MLP, twice) + 2 x 64 x 300 (LM head, one row) + 4 x 2 x 4 x 16 x 6 (6 causal
    pairs) = 483,840 FLOPs; it reads 4 x (73,728 + 19,200) bytes of weights and writes 3 tokens of
    K and V (2 x 2 x 2 x 16 x 4 = 512 bytes each). In a 2-s window on a 1 MFLOP/s, 1 MB/s device."""
    config = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position_embeddings=512)
    window = TelemetryWindow(cost=ModelCost(ModelShape.of(config), 4), peaks=DevicePeaks(1e6, 1e6, "config"),
                             clock=lambda: 10.0)
    window.on_step(StepRecord(0, 9.0, 0.5, 3, 0, 1, 1, 0, 0, 0.1, 0, 6, 1, 0.0, 0.5, 0.0, 0.0, "sarathi", 0))
    summary = window.window(2.0)
    assert summary.mfu == pytest.approx(483_840 / 2e6)
    assert summary.mbu == pytest.approx((4 * (73_728 + 19_200) + 3 * 512) / 2e6)


def test_quantized_weights_are_counted_as_stored_on_the_kernel_path():
    """MBU of a quantized engine: a step on the kernels reads the stored blocks, a larger one reads
    them to dequantize and then the dense copy; fp32's bytes would overstate a decode's ~5x."""
    config = ModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=16, max_position_embeddings=512)
    shape = ModelShape.of(config)
    dense, quantized = ModelCost(shape, 4), ModelCost(shape, 4, stored_weight_bytes=20_000, kernel_max_rows=8)
    assert quantized.step_weight_bytes(8) == 20_000 and dense.step_weight_bytes(8) == 4 * (73_728 + 19_200)
    assert quantized.step_weight_bytes(9) == 20_000 + dense.weight_bytes


def test_flop_count_matches_the_loaded_model(tiny_hf):
    """ModelCost's closed form and the count from the engine's modules agree on the checkpoint."""
    engine = make_engine(tiny_hf[0])
    cost = ModelCost(ModelShape.of(engine.model_config), 4)
    step = StepRecord(0, 0.0, 0.1, 5, 3, 2, 4, 0, 0, 0.1, 40, 60, 4, 0.0, 0.1, 0.0, 0.0, "sarathi", 0)
    assert (cost.step_flops(step), cost.step_bytes(step)) == flops_and_bytes(engine.runner.model, engine.model_config,
                                                                              step)


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
    openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0).completions.create(
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
