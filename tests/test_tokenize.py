"""POST /tokenize and /detokenize: vLLM's shapes, the ids the engine prefills (chat messages through the
same template as /v1/chat/completions), and OpenAI-shaped errors."""

from __future__ import annotations

import httpx
import pytest

from engine.model.tokenizer import ByteTokenizer, HFTokenizer
from serving.api_server import ApiConfig
from serving.tokenize_api import chat_ids, encode, token_strs
from tests.conftest import make_engine
from tests.live_server import LiveServer

MODEL = "tiny"
MESSAGES = [{"role": "system", "content": "w7"}, {"role": "user", "content": "w5 w6"}]


@pytest.fixture(scope="module")
def server(tiny_hf):
    api = ApiConfig(served_model_name=MODEL, default_max_tokens=2)
    with LiveServer(lambda: make_engine(tiny_hf[0], num_kv_blocks=64), api) as s:
        yield s


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30)


def test_tokenize_a_prompt(server):
    r = post(server, "/tokenize", {"prompt": "w5 w6 w299", "model": MODEL})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3, "max_model_len": server.engine.max_model_len, "tokens": [5, 6, 299],
                        "token_strs": None}
    assert r.json()["max_model_len"] == 512
    r = post(server, "/tokenize", {"prompt": "w5 w6", "return_token_strs": True, "add_special_tokens": None})
    assert r.json()["tokens"] == [5, 6] and r.json()["token_strs"] == ["w5", "w6"]


def test_tokenize_messages_counts_what_chat_completions_prefills(server):
    r = post(server, "/tokenize", {"messages": MESSAGES})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    assert ids == server.engine.tokenizer.apply_chat_template(MESSAGES) == [7, 5, 6]
    chat = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == r.json()["count"] == 3
    parts = [{"role": "developer", "content": [{"type": "text", "text": "w7"}]}, MESSAGES[1]]   # as on /v1
    assert post(server, "/tokenize", {"messages": parts, "add_generation_prompt": False}).json()["tokens"] == ids


def test_detokenize_round_trips(server):
    r = post(server, "/detokenize", {"tokens": [5, 6, 299]})
    assert r.status_code == 200 and r.json() == {"prompt": "w5 w6 w299"}
    ids = post(server, "/tokenize", {"prompt": "w9 w10 w11"}).json()["tokens"]
    assert post(server, "/detokenize", {"tokens": ids}).json()["prompt"] == "w9 w10 w11"
    assert post(server, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path,body,param", [
    ("/detokenize", {"tokens": [5, 300]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": ["w5"]}, "tokens.0"),
    ("/detokenize", {}, "tokens"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "w5", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "w5"}]}, "messages.0.role"),
    ("/tokenize", {"prompt": "w5", "model": "gpt-5"}, "model"),
    ("/detokenize", {"tokens": [5], "model": "gpt-5"}, "model"),
])
def test_bad_bodies_are_openai_shaped_400s(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_a_null_reads_as_absent(server):
    r = post(server, "/tokenize", {"prompt": "w5", "messages": None, "return_token_strs": None})
    assert r.status_code == 200 and r.json()["tokens"] == [5] and r.json()["token_strs"] is None


def bos_tokenizer(tiny_hf) -> HFTokenizer:
    """The tiny model's word tokenizer with a BOS added to every encoded text."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_hf[0])
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return HFTokenizer(tok)


def test_add_special_tokens(tiny_hf):
    tok = bos_tokenizer(tiny_hf)
    assert encode(tok, "w5 w6") == [1, 5, 6] == tok.encode("w5 w6")
    assert encode(tok, "w5 w6", add_special_tokens=False) == [5, 6]
    assert encode(ByteTokenizer(300), "a", add_special_tokens=False) == [ord("a") + 3]


def test_add_generation_prompt_renders_the_assistant_turn_or_not():
    tok = ByteTokenizer(300)
    messages = [{"role": "user", "content": "hi"}]
    with_prompt, without = chat_ids(tok, messages), chat_ids(tok, messages, add_generation_prompt=False)
    assert with_prompt == tok.apply_chat_template(messages)
    assert tok.decode(with_prompt) == tok.decode(without) + "assistant: "
    assert token_strs(tok, tok.encode("ab")) == ["a", "b"]
