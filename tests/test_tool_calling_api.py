"""Tool calling and reasoning through the chat API: tools reach the template, tool_choice is enforced by the
grammar, calls come back whole and streamed alike, and what cannot be served is a 400 naming it."""

from __future__ import annotations

import json
import os
import threading

import httpx
import jsonschema
import pytest

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from serving.api_server import ApiConfig
from serving.chat_plan import ChatParsers
from tests.live_server import LiveServer

pytestmark = pytest.mark.slow

QWEN = os.path.expanduser("~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf")
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The local time in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string"}}}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris and the time in Rome?"}]


def serve(model: str | None, parsers: ChatParsers = ChatParsers()) -> LiveServer:
    api = ApiConfig(served_model_name="m", max_waiting=64, default_max_tokens=96, chat_parsers=parsers)
    return LiveServer(lambda: LLMEngine(EngineConfig(model=model, kv_cache_memory_mb=96)), api)


@pytest.fixture(scope="module")
def hermes_on_smollm2():
    """The bundled model's template has no tools; told that its calls are Hermes blocks, the grammar makes it
    write them (its template cannot show it the tools, so only forced choices are tested on it)."""
    with serve(None, ChatParsers(tool_call_parser="hermes")) as s:
        yield s


def chat(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions",
                      json={"messages": ASK, "temperature": 0, "max_tokens": 96, **body}, timeout=120)


def streamed(server, **body) -> tuple[dict, str]:
    """The streamed reply assembled as a client does: content concatenated, each call's id and name from its
    first delta and its arguments from the fragments; and the last finish_reason."""
    message: dict = {"content": "", "tool_calls": {}}
    reason = None
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json={"messages": ASK, "temperature": 0, "max_tokens": 96, "stream": True, **body}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                delta, reason = choice["delta"], choice["finish_reason"] or reason
                message["content"] += delta.get("content") or ""
                for call in delta.get("tool_calls", []):
                    slot = message["tool_calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                    slot["id"] = call.get("id", slot["id"])
                    slot["name"] += call.get("function", {}).get("name", "")
                    slot["arguments"] += call.get("function", {}).get("arguments", "")
    return message, reason


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_choice_gives_valid_calls_whole_and_streamed_alike(hermes_on_smollm2, choice):
    r = chat(hermes_on_smollm2, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert r.status_code == 200, r.text
    whole = r.json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    calls = calls_of(whole["message"])
    assert calls and all(name in ("get_weather", "get_time") for name, _ in calls)
    if isinstance(choice, dict):
        assert {name for name, _ in calls} == {"get_weather"}
    for name, arguments in calls:
        jsonschema.validate(arguments, TOOLS[0 if name == "get_weather" else 1]["function"]["parameters"])
    message, reason = streamed(hermes_on_smollm2, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert reason == "tool_calls" and message["content"] == ""
    assert [(c["name"], c["arguments"]) for c in message["tool_calls"].values()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in whole["message"]["tool_calls"]]
    assert all(c["id"].startswith("call_") for c in message["tool_calls"].values())


def test_parallel_calls_each_name_a_tool_and_validate(hermes_on_smollm2):
    """SmolLM2 never saw the tools (its template cannot show them): it goes on calling until max_tokens, but
    every call it completes is a declared function with valid arguments."""
    r = chat(hermes_on_smollm2, tools=TOOLS, tool_choice="required", max_tokens=120)
    calls = calls_of(r.json()["choices"][0]["message"])
    assert len(calls) >= 2
    for name, arguments in calls:
        jsonschema.validate(arguments, TOOLS[0 if name == "get_weather" else 1]["function"]["parameters"])


def test_tool_choice_none_gives_text(hermes_on_smollm2):
    r = chat(hermes_on_smollm2, tools=TOOLS, tool_choice="none", max_tokens=8)
    message = r.json()["choices"][0]["message"]
    assert r.status_code == 200 and "tool_calls" not in message and message["content"]


@pytest.mark.parametrize("body, param, words", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "book_flight"}}}, "tool_choice",
     "'book_flight', which is not among tools"),
    ({"tool_choice": "required"}, "tool_choice", "no tools were given"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "twice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "pattern"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot be combined with tools"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages", "tool_call_id"),
    ({"chat_template_kwargs": {"messages": []}}, "messages", "may not set messages"),
])
def test_bad_tool_requests_are_a_400_naming_the_problem(hermes_on_smollm2, body, param, words):
    r = chat(hermes_on_smollm2, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and (error["param"] or "").startswith(param), error


def test_a_template_without_tools_refuses_them():
    with serve(None) as server:
        r = chat(server, tools=TOOLS)
        assert r.status_code == 400 and "no tool support" in r.json()["error"]["message"]
        normal = []
        thread = threading.Thread(target=lambda: normal.append(chat(server, max_tokens=8)))
        thread.start()
        refused = [chat(server, tools=TOOLS).status_code for _ in range(5)]
        thread.join()
        assert set(refused) == {400} and normal[0].status_code == 200
        assert chat(server, tools=TOOLS, tool_choice="none", max_tokens=4).status_code == 200


@pytest.mark.skipif(not os.path.exists(QWEN), reason="the Qwen2.5-Coder 0.5B file is absent")
def test_qwen_sees_the_tools_and_the_history_of_calls():
    with serve(QWEN) as server:
        r = chat(server, tools=TOOLS, tool_choice="required", max_tokens=120)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        names = [name for name, _ in calls_of(message)]
        assert "get_weather" in names
        prompt = server.engine.tokenizer.render_chat(
            [*ASK, {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "18 C"}], tools=TOOLS)
        assert "get_time" in prompt and '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        history = [*ASK, {**message, "content": message["content"]}, *[
            {"role": "tool", "tool_call_id": c["id"], "content": "18 C, sunny"} for c in message["tool_calls"]]]
        answer = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "messages": history, "tools": TOOLS, "tool_choice": "none", "temperature": 0, "max_tokens": 40})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
