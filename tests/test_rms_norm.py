"""The CPU kernels' RMSNorm after the residual add (engine/kernels/csrc/rms_norm.c) against torch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.kernels.cpu_kernels import load_library
from engine.model.transformer import RMSNorm

LIBRARY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="CPU kernels not built")


@pytest.mark.parametrize("rows", [1, 7, 300])     # 300: split over the thread pool
@pytest.mark.parametrize("size", [576, 40, 8])    # 40: a tail after the 16-float loop
@pytest.mark.parametrize("with_delta", [False, True])
def test_matches_torch(isa, rows, size, with_delta):
    g = torch.Generator().manual_seed(rows * size)
    h = torch.randn(rows, size, generator=g) * 4
    delta = torch.randn(rows, size, generator=g) if with_delta else None
    weight = torch.randn(size, generator=g)
    expected_h = h + delta if with_delta else h.clone()
    expected = F.rms_norm(expected_h, (size,), weight, 1e-5)
    out = LIBRARY.add_rms_norm(h, delta, weight, 1e-5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, expected_h, atol=0, rtol=0)   # the add landed in h


def test_module_add_norm_matches_the_unfused_torch_ops():
    """RMSNorm.add_norm on fp32 CPU tensors (the kernel) against h + delta then torch's norm, and the
    module's forward on a non-contiguous input."""
    norm = RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 64))
    h, delta = torch.randn(3, 64), torch.randn(3, 64)
    expected_h = h + delta
    new_h, out = norm.add_norm(h.clone(), delta)
    torch.testing.assert_close(new_h, expected_h)
    torch.testing.assert_close(out, F.rms_norm(expected_h, (64,), norm.weight, 1e-6))
    x = torch.randn(64, 3).t()
    torch.testing.assert_close(norm(x), F.rms_norm(x, (64,), norm.weight, 1e-6))
