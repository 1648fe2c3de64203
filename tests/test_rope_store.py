"""A decode step's rotary embedding and KV-cache write in one C pass (engine/kernels/csrc/rope_store.c)
against the torch ops it replaces (engine.attention.split_rotated, then index_copy_ into the caches).
The engine runs it in the CPU backend's pure decode steps: tests/test_cpu_attention.py's greedy tokens
under both backends cover that path."""

from __future__ import annotations

import pytest
import torch

from engine.attention.backends import HeadShape, split_rotated
from engine.kernels.cpu_kernels import load_library
from engine.model_config import RopeScaling
from engine.attention.rope import RotaryEmbedding

LIBRARY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="CPU kernels not built")


class Config:   # what RotaryEmbedding reads of a ModelConfig
    def __init__(self, head_dim: int) -> None:
        self.head_dim, self.rope_theta, self.rope_scaling = head_dim, 10000.0, RopeScaling()
        self.rotary_dims = head_dim   # RoPE over every dim


@pytest.mark.parametrize("heads", [HeadShape(9, 3, 64), HeadShape(4, 2, 24), HeadShape(2, 1, 6)],
                         ids=["smollm2", "24-dims", "6-dims"])    # 24 and 6: no whole 8-float vectors per half
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_matches_the_torch_ops(isa, heads, cache_dtype):
    tokens, slots = 5, 40
    g = torch.Generator().manual_seed(heads.head_dim)
    qkv = torch.randn(tokens, (heads.num_heads + 2 * heads.num_kv_heads) * heads.head_dim, generator=g) * 3
    rotary = RotaryEmbedding(Config(heads.head_dim), 512)
    cos, sin = rotary.lookup(torch.tensor([0, 7, 100, 511, 3]))
    slot_mapping = torch.tensor([4, 39, 0, 17, 18])
    shape = (slots, heads.num_kv_heads, heads.head_dim)
    k_cache, v_cache = torch.full(shape, 9.0, dtype=cache_dtype), torch.full(shape, 9.0, dtype=cache_dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    q = LIBRARY.rope_store(qkv, heads, cos, sin, slot_mapping, k_cache, v_cache)

    q_ref, k, v = split_rotated(qkv, heads, cos, sin)
    k_ref.index_copy_(0, slot_mapping, k.to(cache_dtype))
    v_ref.index_copy_(0, slot_mapping, v.to(cache_dtype))
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    # fp16: the same rounding of the same fp32 value, except where the rotation's last bit differs
    torch.testing.assert_close(k_cache, k_ref, atol=1e-5 if cache_dtype == torch.float32 else 2e-3, rtol=1e-3)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0)        # values are copied: exact, untouched slots too


def test_fp16_rounding_of_edge_values(isa):
    """Values are stored as torch rounds them: ties to even, subnormals, overflow to inf, nan."""
    heads = HeadShape(1, 1, 16)
    edge = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65520.0, 1e6, -1e6, 2 ** -24, 2 ** -25,
                         3 * 2 ** -26, 1e-3, -5.96e-8, 0.0, -0.0, float("nan"), 1 / 3, 2 ** -14 - 2 ** -25])
    qkv = torch.cat([torch.zeros(32), edge]).reshape(1, 48)      # q and k zero, v the edge values
    cos, sin = torch.ones(1, 16), torch.zeros(1, 16)
    k_cache, v_cache = torch.zeros(1, 1, 16, dtype=torch.float16), torch.zeros(1, 1, 16, dtype=torch.float16)
    LIBRARY.rope_store(qkv, heads, cos, sin, torch.tensor([0]), k_cache, v_cache)
    torch.testing.assert_close(v_cache.view(16), edge.to(torch.float16), atol=0, rtol=0, equal_nan=True)
    assert (v_cache.view(16).view(torch.int16) == edge.to(torch.float16).view(torch.int16)).all()   # signs too
