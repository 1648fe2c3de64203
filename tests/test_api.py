"""The OpenAI-compatible API on a live loopback server, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from serving.api_server import ApiConfig
from tests.conftest import make_engine
from tests.live_server import LiveServer

MODEL = "tiny"


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name=MODEL, max_waiting=64, max_body_bytes=64 * 1024, default_max_tokens=16)
    with LiveServer(lambda: make_engine(tiny_hf[0], num_kv_blocks=256, block_size=4, token_budget=64), api) as s:
        yield s


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def wait_idle(server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while server.state.loop.num_unfinished and time.monotonic() < deadline:
        time.sleep(0.02)
    bm = server.engine.block_manager
    assert server.state.loop.num_unfinished == 0
    assert bm.num_free_blocks == bm.num_blocks, "KV blocks not freed"


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completion_non_streaming(server, client):
    r = client.completions.create(model=MODEL, prompt="w5 w6 w7", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].text.split()) == 5
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 5, 8)
    wait_idle(server)


def test_completion_streaming_matches_non_streaming(server, client):
    kwargs = dict(model=MODEL, prompt="w5 w6 w7", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_streaming_and_not(server, client):
    messages = [{"role": "user", "content": "w9 w10"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.prompt_tokens == 2
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content


def test_sse_framing(server):
    body = {"model": MODEL, "prompt": "w5", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[6:])["object"] == "text_completion"


def test_fifty_concurrent_streaming_clients(server):
    async def one(client: openai.AsyncOpenAI, i: int) -> int:
        stream = await client.completions.create(model=MODEL, prompt=f"w{5 + i} w7", max_tokens=8, stream=True,
                                                 extra_body={"ignore_eos": True}, stream_options={"include_usage": True})
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    async def main() -> list[int]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        return await asyncio.gather(*(one(client, i) for i in range(50)))

    assert asyncio.run(main()) == [8] * 50
    wait_idle(server)


def test_disconnect_mid_stream_frees_kv(server):
    body = {"model": MODEL, "prompt": "w5 w6", "max_tokens": 500, "stream": True, "ignore_eos": True}
    aborted = server.engine.finished_by_reason["abort"]
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert server.engine.block_manager.num_free_blocks < server.engine.block_manager.num_blocks
    wait_idle(server)
    assert server.engine.finished_by_reason["abort"] == aborted + 1


@pytest.mark.parametrize("body,status,param", [
    ({"model": MODEL, "prompt": "w5", "max_tokens": -1}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "w5", "max_tokens": "many"}, 400, "max_tokens"),
    ({"model": MODEL, "prompt": "w5 " * 600, "max_tokens": 4}, 400, "prompt"),
    ({"model": "gpt-5", "prompt": "w5"}, 400, "model"),
    ({"model": MODEL, "prompt": "w5", "n": 17}, 400, "n"),
    ({"model": MODEL, "prompt": "w5", "n": 2, "best_of": 1}, 400, "best_of"),
    ({"model": MODEL, "prompt": "w5", "best_of": 3, "stream": True}, 400, "best_of"),
    ({"model": MODEL, "prompt": ""}, 400, "prompt"),
    ({"model": MODEL}, 400, "prompt"),
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "seed": -2**63 - 1}, 400, "seed"),
])
def test_bad_input_gets_openai_errors(server, body, status, param):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_bad_json_and_oversized_body(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "w5 " * 40000})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_full_queue_answers_429_with_retry_after(tiny_hf):
    api = ApiConfig(served_model_name=MODEL, max_waiting=2)
    with LiveServer(lambda: make_engine(tiny_hf[0], max_num_seqs=1), api) as server:
        async def one(client: httpx.AsyncClient) -> httpx.Response:
            return await client.post("/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 200,
                                                               "ignore_eos": True})

        async def main() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(one(client) for _ in range(8)))

        responses = asyncio.run(main())
        rejected = [r for r in responses if r.status_code == 429]
        assert rejected and all(r.headers["retry-after"] for r in rejected)
        assert rejected[0].json()["error"]["type"] == "rate_limit_error"
        assert all(r.status_code in (200, 429) for r in responses)
        wait_idle(server)


def test_a_failing_step_fails_its_requests_and_the_server_keeps_serving(server, client, monkeypatch):
    runner = server.engine.runner
    original = runner.execute

    def broken(*args, **kwargs):
        monkeypatch.setattr(runner, "execute", original)   # only the next step fails
        raise RuntimeError("injected")

    monkeypatch.setattr(runner, "execute", broken)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=MODEL, prompt="w5", max_tokens=3)
    r = client.completions.create(model=MODEL, prompt="w5", max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
    wait_idle(server)


@pytest.mark.parametrize("path,where", [("/v1/completions", "body"), ("/v1/chat/completions", "header"),
                                        ("/v1/completions", "both")])
def test_unknown_slo_class_is_400_and_queues_nothing(server, monkeypatch, path, where):
    arrivals: list = []
    monkeypatch.setattr(server.engine, "arrival_listeners", [arrivals.append])
    body = {"model": MODEL, "max_tokens": 2, **({"messages": [{"role": "user", "content": "w5"}]}
                                                  if "chat" in path else {"prompt": "w5"})}
    # "both": a known header does not rescue an unknown body field, which wins
    headers = {"X-SLO-Class": "gold" if where == "header" else "batch"} if where != "body" else {}
    if where != "header":
        body["slo_class"] = "gold"
    r = httpx.post(server.url + path, json=body, headers=headers)
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == "slo_class" and "'gold'" in error["message"] and "interactive" in error["message"]
    assert server.state.loop.num_unfinished == 0
    ok = httpx.post(server.url + path, json={**body, "slo_class": "batch"})   # the listener sees what is queued
    assert ok.status_code == 200 and [a.request_id for a in arrivals] == [ok.json()["id"]]
    wait_idle(server)


def test_slo_class_from_body_field_or_header(server, client, monkeypatch):
    records: dict[str, object] = {}
    monkeypatch.setattr(server.engine, "finish_listeners", [lambda rec: records.__setitem__(rec.request_id, rec)])
    kwargs = dict(model=MODEL, prompt="w5 w6", max_tokens=2)
    ids = {
        "default": client.completions.create(**kwargs).id,
        "body": client.completions.create(**kwargs, extra_body={"slo_class": "batch"}).id,
        "header": client.completions.create(**kwargs, extra_headers={"X-SLO-Class": "batch"}).id,
        "chat body": client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w5"}],
                                                    max_tokens=2, extra_body={"slo_class": "batch"}).id,
        "body wins": client.completions.create(**kwargs, extra_body={"slo_class": "interactive"},
                                               extra_headers={"X-SLO-Class": "batch"}).id,
    }
    got = {how: (records[i].slo_class, records[i].slo_ttft_s, records[i].slo_tbt_s) for how, i in ids.items()}
    assert got == {"default": ("interactive", 2.0, 0.25), "body": ("batch", 30.0, 2.0),
                   "header": ("batch", 30.0, 2.0), "chat body": ("batch", 30.0, 2.0),
                   "body wins": ("interactive", 2.0, 0.25)}
    wait_idle(server)


def test_cache_salt_keeps_tenants_apart_and_usage_reports_cached_tokens(server, client):
    prompt = " ".join(f"w{i}" for i in range(40, 53))          # 13 tokens: 3 full blocks of 4 to reuse
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    cached = lambda salt: client.completions.create(  # noqa: E731
        **{**kwargs, "extra_body": {"ignore_eos": True, "cache_salt": salt}}).usage.prompt_tokens_details.cached_tokens
    assert cached("tenant-a") == 0
    assert cached("tenant-a") == 12
    assert cached("tenant-b") == 0                     # the same prompt, another tenant: nothing shared
    wait_idle(server)


def test_admission_refusal_is_a_429_with_the_predicted_drain_and_counts_as_shed(server, monkeypatch):
    from engine.scheduling.admission import SHED_PREDICTED, Admission
    admission = server.engine.scheduler.admission
    monkeypatch.setattr(admission, "decide", lambda *a, **k: Admission(False, 5.2, 3.2, SHED_PREDICTED))
    before = server.engine.finished_by_reason["shed"]
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 3,
                                                         "stream": True})
    assert r.status_code == 429 and r.headers["retry-after"] == "4"
    assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "overloaded"
    deadline = time.monotonic() + 5
    while server.engine.finished_by_reason["shed"] == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.finished_by_reason["shed"] == before + 1
    wait_idle(server)
