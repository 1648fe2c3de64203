"""The tokenizer of a GGUF file, built without AutoTokenizer (engine/model/tokenizer.py), encodes and decodes as
AutoTokenizer's does, with the same special tokens and chat template: on the bundled file, and on the real
files of ../shared/models/get-model.sh where they are present."""

from __future__ import annotations

import os

import pytest
from transformers import AutoTokenizer

from engine.model.checkpoint import bundled_model_path
from engine.model.tokenizer import load_tokenizer

MODELS_DIR = os.environ.get("MODELS_DIR", os.path.expanduser("~/.cache/autotuned-models"))
REAL_FILES = ["qwen2.5-coder-0.5b.gguf", "gemma-3-270m.gguf"]
TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
         "Hello, world! 你好 <|im_start|>user\nhi<|im_end|>",
         "  leading spaces\tand tabs: ü ß é, digits 1234567",
         "<bos><start_of_turn>user\nwhat is 2+2?<end_of_turn>"]


def files() -> list:
    real = [pytest.param(os.path.join(MODELS_DIR, name),
                         marks=pytest.mark.skipif(not os.path.isfile(os.path.join(MODELS_DIR, name)),
                                                  reason=f"../shared/models/get-model.sh {name[:-5]}"))
            for name in REAL_FILES]
    return [bundled_model_path(), *real]


@pytest.mark.parametrize("path", files())
def test_gguf_tokenizer_matches_auto_tokenizer(path: str) -> None:
    ours = load_tokenizer("gguf", path, vocab_size=0)
    auto = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    for text in TEXTS:
        ids = auto.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == auto.decode(ids, skip_special_tokens=True), text   # as served
    assert (ours._tok.bos_token, ours._tok.eos_token) == (auto.bos_token, auto.eos_token)
    assert ours._tok.chat_template == auto.chat_template
