"""GGUF loading: llama.cpp's q/k permutation is undone, and broken files give a clear error."""

from __future__ import annotations

import os

import pytest

from engine import LLMEngine, EngineConfig, ModelLoadError
from engine.checkpoint import read_gguf
from tests.conftest import make_engine
from tests.gguf_writer import write_gguf
from tests.test_hf_equivalence import hf_greedy, prompts, run_all


@pytest.fixture(scope="module")
def tiny_gguf(tiny_hf, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    write_gguf(tiny_hf[1], path)
    return path


def test_gguf_weights_generate_like_hf(tiny_hf, tiny_gguf):
    engine = make_engine(tiny_gguf, token_budget=9)
    prompt_list = prompts(3, seed=7)
    assert run_all(engine, prompt_list, 10) == [hf_greedy(tiny_hf[1], p, 10) for p in prompt_list]


def test_gguf_tokenizer_comes_from_the_file(tiny_gguf):
    engine = make_engine(tiny_gguf)
    assert engine.tokenizer.eos_token_ids == (2,)
    ids = engine.tokenizer.encode("hi")
    assert engine.tokenizer.decode(ids) == "hi"


def test_truncated_gguf_is_a_clear_error(tiny_gguf, tmp_path):
    broken = tmp_path / "broken.gguf"
    with open(tiny_gguf, "rb") as f:
        broken.write_bytes(f.read()[: os.path.getsize(tiny_gguf) // 2])
    with pytest.raises(ModelLoadError, match="cannot read GGUF file"):
        read_gguf(str(broken))


def test_garbage_gguf_is_a_clear_error(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="cannot read GGUF file"):
        LLMEngine(EngineConfig(model=str(garbage), dtype="fp32"))
