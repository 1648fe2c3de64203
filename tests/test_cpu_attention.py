"""The C kernel's paged decode attention (engine/attention/cpu_attention.py) against the torch backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.attention.backends import TorchAttention, make_attention_backend
from engine.engine_config import EngineConfig
from engine.kernels.cpu_kernels import load_library
from tests.attention_layouts import greedy_tokens_by_backend, make_layout

LIBRARY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="CPU kernels not built")


def attend_both(layout, num_blocks: int, heads: int, kv_heads: int, head_dim: int,
                kv_dtype: torch.dtype = torch.float32):
    """One step through the torch backend and the CPU one, from the same cache (garbage beyond the
    sequences' slots, which neither may read); returns ((out, k_cache, v_cache), ...) per backend."""
    g = torch.Generator().manual_seed(0)
    t, slots = layout.num_tokens, num_blocks * layout.block_size
    q = torch.randn(t, heads, head_dim, generator=g) * 3   # scores spread wide: the softmax's max matters
    k, v = (torch.randn(t, kv_heads, head_dim, generator=g) for _ in range(2))
    cache = torch.randn(2, slots, kv_heads, head_dim, generator=g).to(kv_dtype)
    scale = head_dim ** -0.5
    results = []
    for backend in (TorchAttention(scale), make_attention_backend("cpu", scale)):
        k_cache, v_cache = cache[0].clone(), cache[1].clone()
        out = backend.attend(q, k, v, k_cache, v_cache, backend.prepare(layout, torch.device("cpu")))
        results.append((out, k_cache, v_cache))
    return results


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (8, 2, 128), (4, 4, 40), (6, 1, 16)])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_decodes_match_torch(isa, heads, kv_heads, head_dim, block_size, kv_dtype):
    """Lengths on both sides of the kernel's groups of eight keys, a one-key sequence, scattered blocks;
    head_dim 40 is no multiple of 8, so it takes the scalar code even under AVX2. An fp16 cache: both
    backends read the same stored values and compute in fp32."""
    rng = np.random.default_rng(heads * head_dim + block_size)
    contexts = [0, 7, 8, 15, 16, 200, 513]
    layout, n = make_layout(contexts, [1] * len(contexts), len(contexts), block_size, rng)
    (ref, ref_k, ref_v), (out, k_cache, v_cache) = attend_both(layout, n, heads, kv_heads, head_dim, kv_dtype)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_mixed_step_matches_torch(isa, kv_dtype):
    """Decodes first, then a first chunk and a later chunk (the chunks on the C prefill kernel under AVX-512)."""
    rng = np.random.default_rng(4)
    layout, n = make_layout([12, 300, 0, 21], [1, 1, 11, 6], 2, 16, rng)
    (ref, _, _), (out, _, _) = attend_both(layout, n, 9, 3, 64, kv_dtype)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


NEEDS_AVX2 = pytest.mark.skipif(LIBRARY is None or not LIBRARY.avx2, reason="auto picks the kernel only where AVX2 runs")


@NEEDS_AVX2
def test_registry_chooses_the_kernel_for_fp32_on_the_cpu():
    assert make_attention_backend("auto", 1.0, "cpu").name == "cpu"
    assert make_attention_backend("auto", 1.0, "cpu", torch.bfloat16).name == "torch"
    with pytest.raises(ValueError, match="fp32 models on the CPU"):
        make_attention_backend("cpu", 1.0, "cpu", torch.bfloat16)


@NEEDS_AVX2
def test_kv_cache_dtype_auto_is_fp16_under_the_kernel_only():
    config = EngineConfig()
    assert config.kv_torch_dtype(torch.float32) == torch.float16
    assert config.kv_torch_dtype(torch.bfloat16) == torch.bfloat16
    assert EngineConfig(attention_backend="torch").kv_torch_dtype(torch.float32) == torch.float32
    assert EngineConfig(kv_cache_dtype="fp32").kv_torch_dtype(torch.float32) == torch.float32
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'int4'"):
        EngineConfig(kv_cache_dtype="int4").kv_torch_dtype(torch.float32)


def test_engine_greedy_tokens_match_torch(tiny_hf):
    """Whole generations with chunked prompts beside running decodes: the same greedy tokens, with the
    same fp16 cache under both backends."""
    path, _ = tiny_hf
    prompts = [[5, 17, 42, 99, 7, 3, 250, 11, 64, 8, 19], [9, 8, 7], [100, 200] * 20]
    results = {}
    for backend in ("torch", "cpu"):
        results[backend], engine = greedy_tokens_by_backend(path, backend, prompts, 12, kv_cache_dtype="fp16")
        assert engine.runner.kv_cache.dtype == torch.float16
    assert results["cpu"] == results["torch"]
