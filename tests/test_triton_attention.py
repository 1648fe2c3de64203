"""The Triton attention backend against the torch reference, on tiny fp32 shapes.

Without a GPU the kernels run in Triton's CPU interpreter, which must be switched on before triton
is imported (the choice is made when the kernels are decorated).
"""

from __future__ import annotations

import os

import torch

INTERPRET = not torch.cuda.is_available()
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("triton")

from engine.attention.backends import TorchAttention, make_attention_backend  # noqa: E402
from engine.attention.batch_layout import BatchLayout  # noqa: E402
from engine.attention.triton_attention import TritonAttention  # noqa: E402
from tests.attention_layouts import greedy_tokens_by_backend, make_layout  # noqa: E402
from engine import SamplingParams  # noqa: E402
from tests.conftest import make_engine  # noqa: E402

H, KVH = 4, 2
# The kernels run either in the interpreter (CPU tensors) or compiled for the GPU, never both at once.
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="GPU present: kernels are compiled")),
           pytest.param("cuda", marks=pytest.mark.skipif(INTERPRET, reason="no GPU"))]


def run_both(layout: BatchLayout, num_blocks: int, head_dim: int, device: str, dtype: torch.dtype):
    """Same inputs and same pre-filled cache through both backends; returns (outs, caches) per backend."""
    g = torch.Generator().manual_seed(0)
    t, slots = layout.num_tokens, num_blocks * layout.block_size
    q = torch.randn(t, H, head_dim, generator=g).to(device, dtype)
    k, v = (torch.randn(t, KVH, head_dim, generator=g).to(device, dtype) for _ in range(2))
    cache = torch.randn(2, slots, KVH, head_dim, generator=g).to(device, dtype)   # context K/V and garbage elsewhere
    scale = head_dim ** -0.5
    results = []
    for backend in (TorchAttention(scale), TritonAttention(scale)):
        k_cache, v_cache = cache[0].clone(), cache[1].clone()
        meta = backend.prepare(layout, torch.device(device))
        out = backend.attend(q, k, v, k_cache, v_cache, meta)
        results.append((out, k_cache, v_cache))
    return results


def check(layout: BatchLayout, num_blocks: int, head_dim: int, device: str, dtype: torch.dtype = torch.float32) -> None:
    (ref, ref_k, ref_v), (out, k_cache, v_cache) = run_both(layout, num_blocks, head_dim, device, dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2   # bf16: both round their output, in different orders
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    torch.testing.assert_close(k_cache, ref_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, ref_v, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim,block_size,context_lens", [(16, 4, [0, 7, 40]), (24, 16, [33, 1]), (16, 16, [5])])
def test_decode_only(device, head_dim, block_size, context_lens):
    rng = np.random.default_rng(1)
    layout, n = make_layout(context_lens, [1] * len(context_lens), len(context_lens), block_size, rng)
    check(layout, n, head_dim, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim,block_size", [(16, 4), (24, 16)])
def test_prefill_first_chunk(device, head_dim, block_size):
    rng = np.random.default_rng(2)
    layout, n = make_layout([0, 0, 0], [1, 9, 37], 0, block_size, rng)
    check(layout, n, head_dim, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim,block_size", [(16, 4), (24, 16)])
def test_prefill_later_chunk_with_cached_context(device, head_dim, block_size):
    rng = np.random.default_rng(3)
    layout, n = make_layout([40, 3, 16], [5, 13, 1], 0, block_size, rng)
    check(layout, n, head_dim, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim,block_size", [(16, 4), (24, 16)])
def test_mixed_batch(device, head_dim, block_size):
    """Two decodes first, then a first chunk and a later chunk; the cache after the write must match too."""
    rng = np.random.default_rng(4)
    layout, n = make_layout([12, 0, 0, 21], [1, 1, 11, 6], 2, block_size, rng)
    check(layout, n, head_dim, device)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_batch_bf16(device):
    """bf16 caches: the kernels upcast every load to fp32 (the interpreter needs it; the GPU loses nothing)."""
    rng = np.random.default_rng(5)
    layout, n = make_layout([9, 0, 30], [1, 14, 3], 1, 4, rng)
    check(layout, n, 24, device, torch.bfloat16)


def test_registry():
    assert make_attention_backend("torch", 1.0, "cpu").name == "torch"
    assert make_attention_backend("auto", 1.0, "cpu", torch.bfloat16).name == "torch"
    if INTERPRET:
        assert make_attention_backend("triton", 1.0, "cpu").name == "triton"
    else:
        assert make_attention_backend("auto", 1.0, "cuda").name == "triton"
        with pytest.raises(ValueError, match="runs on CUDA"):
            make_attention_backend("triton", 1.0, "cpu")
    with pytest.raises(ValueError, match="expected one of torch, cpu, triton, auto"):
        make_attention_backend("flash", 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_engine_greedy_tokens_match_torch(tiny_hf, device):
    """Mixed steps (a budget of 8 chunks prompts beside running decodes) give the same greedy tokens."""
    path, _ = tiny_hf
    prompts = [[5, 17, 42, 99, 7, 3, 250, 11, 64, 8, 19], [9, 8, 7], [100, 200]]
    results = {backend: greedy_tokens_by_backend(path, backend, prompts, 5, device=device)[0]
               for backend in ("torch", "triton")}
    assert results["triton"] == results["torch"]


@pytest.mark.parametrize("device", DEVICES)
def test_write_kv_skips_negative_slots(device):
    """A CUDA graph's padding rows carry slot -1: nothing of theirs reaches the cache."""
    from engine.kernels.triton_kernels import write_kv

    g = torch.Generator().manual_seed(6)
    k, v = (torch.randn(3, KVH, 16, generator=g).to(device) for _ in range(2))
    k_cache, v_cache = torch.zeros(8, KVH, 16, device=device), torch.zeros(8, KVH, 16, device=device)
    write_kv(k, v, k_cache, v_cache, torch.tensor([5, -1, 2], dtype=torch.int32, device=device))
    torch.testing.assert_close(k_cache[[5, 2]], k[[0, 2]])
    torch.testing.assert_close(v_cache[[5, 2]], v[[0, 2]])
    assert k_cache[[0, 1, 3, 4, 6, 7]].abs().sum() == 0 and v_cache[[0, 1, 3, 4, 6, 7]].abs().sum() == 0


class ReplayedEagerly:
    """A stand-in for a CUDA graph on the CPU: replay runs the captured forward again on the static buffers."""

    def __init__(self, graphs, batch: int, output: torch.Tensor) -> None:
        self.graphs, self.batch, self.output = graphs, batch, output

    def replay(self) -> None:
        self.output.copy_(self.graphs._forward(self.batch))


@pytest.mark.skipif(not INTERPRET, reason="GPU present: tests/test_cuda_engine.py replays real graphs")
def test_decode_graph_inputs_on_padded_batches(tiny_hf):
    """DecodeGraphs' static buffers and padding, without a GPU: its graphs stood in for by eager replays over
    the same buffers. Greedy tokens match the plain engine's while 1-3 decodes ride in graphs of 1/2/4."""
    from engine.decode_graphs import DecodeGraphs

    class EagerGraphs(DecodeGraphs):
        def _capture_one(self, batch, pool):
            output = self._forward(batch).clone()
            return ReplayedEagerly(self, batch, output), output, None

    path, _ = tiny_hf
    prompts = [[5, 17, 42, 99, 7, 3, 250, 11, 64, 8, 19], [9, 8, 7], [100, 200]]
    plain, _ = greedy_tokens_by_backend(path, "triton", prompts, 6, device="cpu")
    engine = make_engine(path, token_budget=8, attention_backend="triton")
    r = engine.runner
    r.decode_graphs = EagerGraphs(r.model, r.attention, r.kv_cache, r.block_size, r.max_model_len, max_batch=4)
    r.decode_graphs.capture()
    replays = []
    original = r.decode_graphs.replay
    r.decode_graphs.replay = lambda ids, layout: replays.append(layout.num_seqs) or original(ids, layout)
    ids = [engine.add_request(p, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)) for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {out.request_id: out.token_ids for out in engine.step() if out.finished}
    assert [done[i] for i in ids] == plain
    assert 3 in replays and r.decode_graphs.sizes == [1, 2, 4]
