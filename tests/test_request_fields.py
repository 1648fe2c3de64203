"""Nothing a client sends is silently dropped: every field of OpenAI's request bodies (read from the
installed openai package) is served, ignored and counted, or refused unless it holds its habitual
default; nulls read as absent; the served fields reach SamplingParams."""

from __future__ import annotations

import logging
import typing

import httpx
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from prometheus_client.parser import text_string_to_metric_families

from engine import EngineConfig, SamplingParams
from serving import request_fields
from serving.api_server import ApiConfig
from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.openai_protocol import ChatCompletionRequest, CompletionRequest
from serving.request_fields import CHAT_FIELDS, COMPLETION_FIELDS, Policy
from tests.conftest import make_engine
from tests.live_server import LiveServer

MODEL = "tiny"
MESSAGES = [{"role": "user", "content": "w5 w6"}]
ENDPOINTS = {"completions": (completion_params, COMPLETION_FIELDS, CompletionRequest, {"prompt": "w5 w6"}),
             "chat": (chat_params, CHAT_FIELDS, ChatCompletionRequest, {"messages": MESSAGES})}

# a value asking for something, for every field that is not served: a new refused or ignored field needs one
NON_DEFAULT = {
    "suffix": "w9", "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required",
    "functions": [{"name": "f"}], "function_call": {"name": "f"}, "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"], "prediction": {"type": "content", "content": "w5"},
    "reasoning_effort": "high", "verbosity": "low", "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
    "user": "user-1", "metadata": {"k": "v"}, "store": True, "service_tier": "flex", "safety_identifier": "s-1",
    "prompt_cache_key": "k-1", "prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"},
    "parallel_tool_calls": False,
}
UNKNOWN = {"use_beam_search": False, "skip_special_tokens": True, "frobnicate": 3}


def openai_fields(module) -> set[str]:
    """Every field of the openai package's request body (`stream` is only on the streaming variants)."""
    return set(typing.get_type_hints(module.CompletionCreateParamsBase)) \
        | set(typing.get_type_hints(module.CompletionCreateParamsStreaming))


def cases(policy: Policy) -> list:
    return [pytest.param(endpoint, name, id=f"{endpoint}-{name}") for endpoint, (_, rules, _, _) in ENDPOINTS.items()
            for name, rule in rules.items() if rule.policy is policy]


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name=MODEL, default_max_tokens=2)
    telemetry = DaemonTelemetry(DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11))
    load = lambda: telemetry.attach(make_engine(tiny_hf[0], num_kv_blocks=128, token_budget=64))  # noqa: E731
    with LiveServer(load, api, extra_routes(telemetry)) as s:
        yield s
    if telemetry.sampler:
        telemetry.sampler.stop()


def post(server, endpoint: str, **fields) -> httpx.Response:
    path, base = ("/v1/completions", {"prompt": "w5 w6"}) if endpoint == "completions" \
        else ("/v1/chat/completions", {"messages": MESSAGES})
    return httpx.post(server.url + path, json={"model": MODEL, "max_tokens": 1, **base, **fields}, timeout=30)


def ignored_counts(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics").text
    return {s.labels["field"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "autotuned:ignored_request_fields_total"}


# --- the table covers the openai package ---

@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_openai_field_is_classified(endpoint):
    module, rules, model, _ = ENDPOINTS[endpoint]
    fields = openai_fields(module)
    assert {"model", "temperature", "stream"} <= fields      # the openai package read right
    assert fields - set(rules) == set(), "OpenAI fields nobody classified in serving/request_fields.py"
    assert set(rules) - fields == set(), "classified fields OpenAI's schema no longer has"
    for name, rule in rules.items():
        assert (name in model.model_fields) == (rule.policy is Policy.SERVED), name
        if rule.policy is not Policy.SERVED:
            assert name in NON_DEFAULT, f"{name}: give the test a non-default value"
            assert rule.why, f"{name}: the docs' table needs the reason"


# --- refused, ignored, unknown ---

@pytest.mark.parametrize("endpoint,name", cases(Policy.REFUSED_UNLESS_DEFAULT))
def test_a_refused_field_is_a_400_naming_it_unless_default(server, endpoint, name):
    r = post(server, endpoint, **{name: NON_DEFAULT[name]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == name and f"{name} is not supported by this server" in error["message"]
    assert error["type"] == "invalid_request_error"
    rules = ENDPOINTS[endpoint][1]
    for default in (None, *rules[name].defaults):
        assert post(server, endpoint, **{name: default}).status_code == 200, (name, default)


@pytest.mark.parametrize("endpoint,name", cases(Policy.IGNORED))
def test_an_ignored_field_is_served_and_counted_unless_default(server, endpoint, name):
    before = ignored_counts(server).get(name, 0)
    assert post(server, endpoint, **{name: NON_DEFAULT[name]}).status_code == 200
    assert ignored_counts(server).get(name, 0) == before + 1
    for default in ENDPOINTS[endpoint][1][name].defaults:      # a habitual default asks for nothing
        assert post(server, endpoint, **{name: default}).status_code == 200
    assert ignored_counts(server).get(name, 0) == before + 1


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_unknown_fields_are_served_and_counted(server, endpoint):
    before = ignored_counts(server)
    # the other endpoint's own fields are unknown here too
    other = {"echo": True} if endpoint == "chat" else {"top_logprobs": 2, "max_completion_tokens": 1}
    r = post(server, endpoint, **UNKNOWN, **other)
    assert r.status_code == 200, r.text
    after = ignored_counts(server)
    for name in [*UNKNOWN, *other]:
        assert after.get(name, 0) == before.get(name, 0) + 1, name
    assert after.get("max_tokens") is None and after.get("model") is None   # served fields are not counted


def test_each_ignored_field_is_logged_once(caplog):
    caplog.set_level(logging.INFO, logger=request_fields.__name__)
    request_fields.note_ignored(["a_field_for_the_log_test"])
    request_fields.note_ignored(["a_field_for_the_log_test", "a_field_for_the_log_test"])
    lines = [r for r in caplog.records if "a_field_for_the_log_test" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_ignored_field_labels_are_bounded():
    from telemetry.prometheus import MAX_IGNORED_FIELD_LABELS, PrometheusMetrics

    metrics = PrometheusMetrics("m")
    for i in range(MAX_IGNORED_FIELD_LABELS + 5):
        metrics.count_ignored_field(f"f{i}")
    metrics.count_ignored_field("f0")
    fields = {s.labels["field"]: s.value for f in metrics.registry.collect() for s in f.samples
              if s.name == "autotuned:ignored_request_fields_total"}
    assert len(fields) == MAX_IGNORED_FIELD_LABELS + 1 and fields["_other"] == 5 and fields["f0"] == 2


# --- null is absent ---

NULLABLE = ["temperature", "top_p", "top_k", "n", "stream", "stream_options", "max_tokens", "stop", "seed",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "logit_bias", "prompt_logprobs",
            "logprobs", "stop_token_ids", "ignore_eos", "min_tokens", "slo_class", "cache_salt", "model"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize("name", NULLABLE + ["echo", "best_of", "top_logprobs", "max_completion_tokens"])
def test_a_null_field_takes_its_default(endpoint, name):
    _, _, model, base = ENDPOINTS[endpoint]
    body = model.model_validate({**base, name: None})
    assert body.sampling_params(7) == model.model_validate(base).sampling_params(7) == SamplingParams(max_tokens=7)
    assert not body.stream and not body.include_usage and body.ignored_fields == []


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_body_with_every_field_null_is_served(server, endpoint):
    module, rules, _, base = ENDPOINTS[endpoint]
    nulls = {name: None for name in [*openai_fields(module), *NULLABLE] if name not in base}
    r = post(server, endpoint, **nulls)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2          # max_tokens: null is the default (2 here)
    assert post(server, endpoint, n=None, stream=None, temperature=None, top_p=None, top_k=None).status_code == 200


def test_a_null_in_stream_options_is_absent():
    body = CompletionRequest.model_validate({"prompt": "w5", "stream": True, "stream_options": {"include_usage": None}})
    assert body.stream and not body.include_usage


# --- the served fields reach SamplingParams ---

SHARED = {"presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.3, "min_p": 0.05,
          "logit_bias": {"7": 5, "11": -100}, "prompt_logprobs": 3}
EXPECTED = {"presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.3, "min_p": 0.05,
            "logit_bias": ((7, 5.0), (11, -100.0)), "prompt_logprobs": 3}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_sampling_fields_reach_sampling_params(endpoint):
    _, _, model, base = ENDPOINTS[endpoint]
    params = model.model_validate({**base, **SHARED}).sampling_params(16)
    for name, value in EXPECTED.items():
        assert getattr(params, name) == value, name
    assert params.logprobs is None and params.shapes_logits


@pytest.mark.parametrize("fields,logprobs,prompt_logprobs", [
    ({}, None, None),
    ({"logprobs": 0}, 0, None),
    ({"logprobs": 3}, 3, None),
    ({"logprobs": 3, "echo": True}, 3, 3),                        # echo scores the prompt too
    ({"logprobs": 3, "echo": True, "prompt_logprobs": 1}, 3, 1),  # unless prompt_logprobs says otherwise
    ({"echo": True}, None, None),
    ({"prompt_logprobs": 2}, None, 2),
])
def test_completion_logprobs_and_echo(fields, logprobs, prompt_logprobs):
    body = CompletionRequest.model_validate({"prompt": "w5", **fields})
    params = body.sampling_params(16)
    assert (params.logprobs, params.prompt_logprobs) == (logprobs, prompt_logprobs)
    assert body.echo is fields.get("echo", False)


@pytest.mark.parametrize("fields,logprobs", [
    ({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5),
    ({"logprobs": True, "top_logprobs": 0}, 0),
])
def test_chat_logprobs_and_top_logprobs(fields, logprobs):
    assert ChatCompletionRequest.model_validate({"messages": MESSAGES, **fields}).sampling_params(16).logprobs \
        == logprobs


@pytest.mark.parametrize("endpoint,fields,param", [
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("completions", {"logprobs": 21}, "logprobs"),
    ("completions", {"logprobs": -1}, "logprobs"),
    ("completions", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("completions", {"logit_bias": {"w5": 1}}, "logit_bias"),
    ("chat", {"logit_bias": {"1.5": 1}}, "logit_bias"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias"),
    ("completions", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("chat", {"presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"frequency_penalty": -3}, "frequency_penalty"),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("chat", {"min_p": 1.5}, "min_p"),
    ("completions", {"n": 17}, "n"),
    ("chat", {"n": 0}, "n"),
    ("completions", {"n": 3, "best_of": 2}, "best_of"),
])
def test_bad_sampling_values_are_400s_naming_the_field(server, endpoint, fields, param):
    r = post(server, endpoint, **fields)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("endpoint,fields", [
    ("completions", {**SHARED, "logprobs": 2, "echo": True, "best_of": 1, "n": 1}),
    ("chat", {**SHARED, "logprobs": True, "top_logprobs": 2}),
])
def test_the_new_sampling_fields_are_served(server, endpoint, fields):
    r = post(server, endpoint, **fields)
    assert r.status_code == 200, r.text
    assert ignored_counts(server).get("logit_bias") is None


def test_the_docs_table_lists_every_field_without_effect():
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "serving.md").read_text()
    for name, rule in {**COMPLETION_FIELDS, **CHAT_FIELDS}.items():
        if rule.policy is not Policy.SERVED:
            policy = "refused" if rule.policy is Policy.REFUSED_UNLESS_DEFAULT else "ignored"
            assert any(line.startswith(f"| `{name}` |") and f"| {policy} |" in line for line in page.splitlines()), \
                f"docs/serving.md's table of fields without effect lacks {name} ({policy})"


def test_the_serving_guide_lists_every_field_without_effect():
    """docs/serving.md's table of refused and ignored fields is the policy, row for row."""
    import re
    from pathlib import Path

    from serving.request_fields import CHAT_FIELDS, COMPLETION_FIELDS, policy_table

    text = (Path(__file__).resolve().parent.parent / "docs" / "serving.md").read_text()
    table = text[text.index("### Fields without effect"):]
    listed = {(name, endpoint, policy) for name, endpoint, policy in
              re.findall(r"^\| `(\w+)` \| (chat|completions|both) \| (refused|ignored) \|", table, re.M)}
    expected = set()
    for endpoint, rules in (("chat", CHAT_FIELDS), ("completions", COMPLETION_FIELDS)):
        for name, rule in policy_table(rules):
            expected.add((name, endpoint, rule.policy.value.split()[0]))
    both = {(n, p) for n, e, p in expected if e == "chat"} & {(n, p) for n, e, p in expected if e == "completions"}
    expected = {(n, e, p) for n, e, p in expected if (n, p) not in both} | {(n, "both", p) for n, p in both}
    assert listed == expected
