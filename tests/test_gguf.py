"""GGUF loading: llama.cpp's q/k permutation is undone, and broken files give a clear error."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, LLMEngine, EngineConfig, ModelLoadError, SamplingParams
from engine.model.checkpoint import read_gguf
from engine.kernels.quantized_linear import load_kernels
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


@pytest.mark.parametrize("weights", ["dense", "quantized"])
def test_a_separate_output_tensor_is_an_untied_head(tiny_hf, tmp_path, weights):
    """output.weight in Q8_0 beside F32 embeddings: with weights=quantized the kernels keep the head and
    not the embeddings (Qwen2.5-Coder-0.5B's Q8_0 head over Q5_0 embeddings failed to load so). The head
    is untied and its logits come from output.weight."""
    import gguf

    if weights == "quantized" and load_kernels() is None:
        pytest.skip("quantized kernels not built")
    path = str(tmp_path / "untied.gguf")
    write_gguf(tiny_hf[1], path, {"output.weight": int(gguf.GGMLQuantizationType.Q8_0)})
    stored = read_gguf(path).state_dict   # everything dequantized: the head as stored, the embeddings
    model = make_engine(path, weights=weights, quantized_max_rows=16).runner.model
    assert not model.config.tie_word_embeddings
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model.lm_head(x).float()
    error = lambda w: float((logits - x @ w.T).norm() / logits.norm())  # noqa: E731
    assert error(stored["lm_head.weight"]) < 0.02           # the Q8_0 kernels quantize x to 8 bits too
    assert error(stored["model.embed_tokens.weight"]) > 0.5


MODELS_DIR = os.environ.get("MODELS_DIR", os.path.expanduser("~/.cache/autotuned-models"))
QWEN_0_5B = os.path.join(MODELS_DIR, "qwen2.5-coder-0.5b.gguf")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isfile(QWEN_0_5B), reason="../shared/models/get-model.sh qwen2.5-coder-0.5b")
def test_real_qwen_0_5b_loads_and_generates():
    """The real file has its own Q8_0 output tensor beside Q5_0 embeddings, and loads."""
    llm = LLM(QWEN_0_5B, num_kv_blocks=8)
    assert not llm.engine.runner.model.config.tie_word_embeddings
    out = llm.generate("def fibonacci(n):", SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    assert len(out.token_ids) == 8 and "if n" in out.text    # "\n    if n <= 0:\n" on the dense and quantized paths
