"""A prefill chunk's causal attention in C (engine/kernels/csrc/prefill_attention.c) against a float64 numpy
reference: the AVX-512 code and the portable one, first chunks and chunks after a context, sliding windows,
grouped query heads, keys read through strides, and shapes the kernel leaves to torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.kernels.cpu_kernels import load_library
from tests.kernel_references import prefill_attention as reference

LIBRARY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="CPU kernels not built")


@pytest.fixture(params=["avx512", "scalar"])
def prefill_isa(request):
    if LIBRARY.set_isa(request.param) != request.param:
        LIBRARY.set_isa("best")
        pytest.skip(f"CPU without the {request.param} kernels")
    yield request.param
    LIBRARY.set_isa("best")


@pytest.mark.parametrize("heads,kv_heads,dim", [(14, 2, 64), (9, 3, 64), (4, 4, 128), (2, 1, 16)])
@pytest.mark.parametrize("n,context,window", [(37, 0, None), (16, 0, None), (1, 0, None), (21, 50, None),
                                              (40, 0, 8), (23, 70, 30)])
def test_matches_the_reference(prefill_isa, heads, kv_heads, dim, n, context, window):
    """n: blocks of 16 queries and a remainder; context: a later chunk (its keys begin before its queries);
    window: a sliding layer's, the keys before it left out (key_start, as prefill_chunks sets it)."""
    g = torch.Generator().manual_seed(n * dim + context)
    key_start = max(context - window + 1, 0) if window else 0
    length = context + n - key_start
    q = torch.randn(n, heads, dim, generator=g) * 3          # scores spread wide: the softmax's max matters
    tokens = torch.randn(2, length, kv_heads, dim, generator=g)
    keys, values = tokens[0].transpose(0, 1), tokens[1].transpose(0, 1)   # [KVH, L, D] views, strided as a chunk's
    got = LIBRARY.prefill_attention(q, keys, values, context, key_start, window, dim ** -0.5)
    expect = reference(q.numpy(), keys.numpy(), values.numpy(), context, key_start, window, dim ** -0.5)
    np.testing.assert_allclose(got.numpy(), expect, atol=2e-5, rtol=1e-4)


def test_shapes_it_does_not_take_are_left_to_the_caller():
    q, kv = torch.randn(4, 2, 40), torch.randn(1, 4, 40)                  # head_dim 40: no multiple of 16
    assert LIBRARY.prefill_attention(q, kv, kv, 0, 0, None, 0.1) is None
    q, kv = torch.randn(4, 3, 16), torch.randn(2, 4, 16)                  # 3 heads over 2 KV heads
    assert LIBRARY.prefill_attention(q, kv, kv, 0, 0, None, 0.1) is None
