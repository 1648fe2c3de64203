"""Pure decode steps in one C call per layer (engine/model/cpu_decode.py, engine/kernels/csrc/decode_layer.c): the
same tokens as the model's Python path, the SiLU * up it adds against torch's, and where it applies."""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.nn.functional as F

from engine.model.cpu_decode import CpuDecodeLayers
from engine.kernels.cpu_kernels import fast_library, load_library
from engine.model.transformer import RMSNorm
from engine.sampling_params import SamplingParams
from tests.conftest import make_engine

LIBRARY = load_library()
pytestmark = pytest.mark.skipif(LIBRARY is None, reason="CPU kernels not built")

ONE_TYPE = {"token_embd.weight": "Q8_0", "output.weight": "Q8_0", "attn_q.weight": "Q4_1", "attn_k.weight": "Q4_1",
            "attn_v.weight": "Q4_1", "attn_output.weight": "Q4_0", "ffn_gate.weight": "Q8_0", "ffn_up.weight": "Q8_0",
            "ffn_down.weight": "Q4_1"}


MIXED = dict(ONE_TYPE, **{"attn_v.weight": "Q8_0"})  # q/k Q4_1 beside v Q8_0: a fused q/k/v of two parts


def tiny_gguf(tiny_hf, tmp_path_factory, types: dict[str, str]) -> str:
    """The tiny Llama as a GGUF of these types (fused projections of one type are merged by the loader)."""
    from gguf import GGMLQuantizationType as T
    from tests.gguf_writer import write_gguf
    path = str(tmp_path_factory.mktemp("ugguf") / "tiny.gguf")
    write_gguf(tiny_hf[1], path, {k: int(T[t]) for k, t in types.items()})
    return path


@pytest.fixture(scope="module")
def uniform_gguf(tiny_hf, tmp_path_factory):
    return tiny_gguf(tiny_hf, tmp_path_factory, ONE_TYPE)


@pytest.fixture(scope="module")
def mixed_gguf(tiny_hf, tmp_path_factory):
    return tiny_gguf(tiny_hf, tmp_path_factory, MIXED)


def greedy(engine, prompts: list[list[int]], tokens: int = 16) -> list[list[int]]:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
    return [done[i] for i in ids]


@pytest.mark.skipif(fast_library() is None, reason="the layer kernel runs where the AVX2 code does")
@pytest.mark.parametrize("variant", ["one type", "mixed types", "qkv bias", "int8 activations"])
def test_decode_steps_give_the_python_paths_logits(uniform_gguf, mixed_gguf, variant, monkeypatch):
    prompts = [[5, 6, 7], [9] * 11, [40, 41, 42, 43, 44, 45, 46]]
    path = mixed_gguf if variant == "mixed types" else uniform_gguf
    activations = "int8" if variant == "int8 activations" else "int16"
    engine = make_engine(path, weights="quantized", quantized_max_rows=64, enable_prefix_caching=False,
                         kernel_activations=activations)
    assert engine.runner.quantized_path.int8 == (activations == "int8")
    model = engine.runner.model
    with torch.no_grad():      # distinct norms (in place: the C layers read these very tensors)
        for i, norm in enumerate(m for m in model.modules() if isinstance(m, RMSNorm)):
            norm.weight.copy_(torch.linspace(0.5, 1.5, norm.weight.numel()).roll(i))
    if variant == "qkv bias":  # as Qwen2's: the layers read the bias where the loader put it
        g = torch.Generator().manual_seed(1)
        for layer in model.model.layers:
            qkv = layer.self_attn.qkv_proj
            qkv.bias = torch.randn(qkv.out_features, generator=g)
        model.decode_layers = CpuDecodeLayers.build(model)
    layers = model.decode_layers
    assert layers is not None
    if variant == "mixed types":
        assert len(model.model.layers[0].self_attn.qkv_proj.parts) == 2
    runs, logits = [], []
    original = type(layers).run
    monkeypatch.setattr(type(layers), "run", lambda self, *a: runs.append(a[0].shape[0]) or original(self, *a))
    model.lm_head.register_forward_hook(lambda module, args, out: logits.append(out.clone()))
    fast = greedy(engine, prompts)
    assert runs and max(runs) == 3                       # batched decode steps took the C layers
    fast_logits, logits[:] = list(logits), []
    model.decode_layers = None
    assert greedy(engine, prompts) == fast
    assert len(logits) == len(fast_logits)
    for slow_step, fast_step in zip(logits, fast_logits):
        torch.testing.assert_close(fast_step, slow_step, rtol=1e-4, atol=2e-4)   # 16-bit activation rounding of SiLU outputs a last bit apart


def test_prefill_steps_and_dense_weights_take_the_python_path(uniform_gguf, tiny_hf):
    layers = make_engine(uniform_gguf, weights="quantized", quantized_max_rows=64).runner.model.decode_layers
    assert layers is not None and not layers.applies(object(), 3)           # not the CPU backend's decode step
    assert make_engine(tiny_hf[0]).runner.model.decode_layers is None          # dense weights


@pytest.mark.parametrize("n,inter", [(1, 1536), (3, 20), (40, 1536)])    # 20: a scalar tail; 40 rows: threads
def test_silu_mul_matches_torch(isa, n, inter):
    g = torch.Generator().manual_seed(inter)
    gu = torch.randn(n, 2 * inter, generator=g) * 6
    gu[0, :8] = torch.tensor([-200.0, -88.5, -30.0, -1e-6, 0.0, 1e-6, 30.0, 200.0])
    y = torch.empty(n, inter)
    LIBRARY.lib.silu_mul(ctypes.c_void_p(gu.data_ptr()), ctypes.c_int64(n), ctypes.c_int64(inter),
                         ctypes.c_void_p(y.data_ptr()))
    torch.testing.assert_close(y, F.silu(gu[:, :inter]) * gu[:, inter:], rtol=2e-6, atol=1e-30)
