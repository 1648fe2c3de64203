"""Shared fixtures: tiny random Hugging Face checkpoints saved to disk, engines over them, and the CPU
kernels' two instruction sets."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine
from engine.kernels.cpu_kernels import load_library
from policies import Knobs

TINY_LLAMA = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)


def save_hf_model(path, model_type: str = "llama", **overrides) -> torch.nn.Module:
    """A random HF model with peaked logits (large init) so greedy argmax has clear winners."""
    import transformers

    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    }[model_type]
    torch.manual_seed(0)
    config = config_cls(**{**TINY_LLAMA, **overrides})
    model = model_cls(config).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(path, safe_serialization=True)
    save_word_tokenizer(path, config.vocab_size)
    return model


def save_word_tokenizer(path, vocab_size: int) -> None:
    """A word-level HF tokenizer: "<pad> <s> </s>" then words w3..wN, so token ids are easy to read."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(path)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return str(path), save_hf_model(path)


def make_engine(model_path: str, num_kv_blocks: int = 64, block_size: int = 4, token_budget: int = 512,
                max_num_seqs: int = 64, **kwargs) -> LLMEngine:
    config = EngineConfig(model=model_path, dtype="fp32", num_kv_blocks=num_kv_blocks, block_size=block_size,
                          knobs=Knobs(token_budget=token_budget, max_num_seqs=max_num_seqs), **kwargs)
    return LLMEngine(config)


def assert_no_kv_leak(engine: LLMEngine) -> None:
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


_exit_status = 0


def pytest_sessionfinish(session, exitstatus) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config) -> None:
    """Leave without interpreter teardown: native threads that daemon tests leave behind (torch's
    pools, SQLite, uvicorn) can abort it with "terminate called without an active exception",
    turning a passing run into exit code 134. Every result is reported by now."""
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


@pytest.fixture(params=["avx2", "scalar"])
def isa(request):
    """Both versions of the CPU kernels: the AVX2 one (where the CPU has it) and the portable one."""
    library = load_library()
    if library is None:
        pytest.skip("CPU kernels not built")
    if request.param == "avx2" and not library.avx2:
        pytest.skip("no AVX2 on this CPU")
    library.set_isa(request.param)
    yield request.param
    library.set_isa("best")
