"""Engine settings, each with the reason it exists."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.model.checkpoint import quantized_kernels_usable, resolve_model
from engine.kernels.cpu_kernels import fast_library
from engine.kv_cache.block_manager import BLOCK_SIZE
from engine.speculation.ngram_drafter import DEFAULT_MAX_NGRAM, DEFAULT_MIN_NGRAM
from engine.errors import ModelLoadError
from policies import DEFAULT_POLICY, Knobs


DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}


@dataclass
class EngineConfig:
    model: str | None = None            # None: bundled SmolLM2; or a preset, .gguf file or HF directory
    dtype: str = "auto"                 # auto: bf16 where the CPU (AMX/AVX512-BF16) or GPU runs it fast,
                                        # except under the quantized kernels (fp32: torch_dtype)
    device: str = "cpu"
    block_size: int = BLOCK_SIZE        # tokens per KV block
    kv_cache_memory_mb: float = 256.0   # KV pool size on the CPU, unless num_kv_blocks is given
    # on CUDA, unless num_kv_blocks is given: the share of the GPU's memory the engine may hold (weights, the
    # measured activation peak of the largest step, the KV pool: the rest of it), as vLLM's option
    gpu_memory_utilization: float = 0.9
    cuda_graphs: bool = True            # on CUDA: replay captured graphs for decode-only steps (decode_graphs.py)
    num_kv_blocks: int | None = None
    max_model_len: int | None = None    # None: the model's own limit, capped at llm_engine.DEFAULT_MAX_MODEL_LEN
    policy: str = DEFAULT_POLICY        # policies/registry.py
    knobs: Knobs = field(default_factory=Knobs)
    max_token_budget: int = 8192        # top of the budget range the knobs may take at run time
    attention_backend: str = "auto"
    seed: int = 0                       # sampling of requests without their own seed; dummy weights
    logprobs_mode: str = "raw"          # logprobs from the model's raw logits (vLLM's default) or "processed":
                                        # after logit bias and penalties (engine/sampler.py's order)
    enable_prefix_caching: bool = True  # reuse the KV of prompt prefixes already in the pool (prefix_cache.py)
    jump_forward: bool = True           # a constrained request's grammar-forced tokens join its output unsampled,
                                        # computed as one chunk (engine/structured/grammar_state.py)
    # speculative decoding's prompt-lookup drafter: the n-gram sizes it matches, longest first
    # (engine/speculation/ngram_drafter.py); how many drafts a step verifies is the knobs' (speculative_tokens)
    ngram_sizes: tuple[int, int] = (DEFAULT_MIN_NGRAM, DEFAULT_MAX_NGRAM)
    # a model with sliding-window layers keeps its KV in pages per layer group, the sliding groups' pages given
    # back as each request's window passes (kv_groups.py; vLLM's hybrid KV cache manager); False: every layer
    # keeps every block, as a model without such layers
    hybrid_kv_cache: bool = True
    # auto: a GGUF's quantized weights stay as stored and small steps run on them with the CPU kernels
    # (quantized_linear.py: decode streams 4.5-8.5 bits per weight, not fp32's 32), where they run fast
    # (AVX2, CPU device); dense: dequantize at load; quantized: as auto, or an error where it cannot.
    # With 16-bit activations it keeps fp32's greedy tokens on the bundled model (tests/test_quantized_linear.py)
    weights: str = "auto"
    quantized_max_rows: int | None = None  # steps up to this many rows use the kernels; None: measure at start-up
    # the kernels' activations: int16 (per block of 32; fp32's greedy tokens above) or int8, llama.cpp's Q8_0
    # activations: ~1.6x faster matmuls on steps of several rows on AVX-512 VNNI (4- to 6-bit types), greedy
    # tokens leave fp32's sooner (docs/cpu_kernels.md)
    kernel_activations: str = "int16"
    # auto: fp16 for an fp32 model on the CPU where the CPU kernels' decode attention reads it (a decode
    # step of a chat batch reads more KV bytes than weight bytes; llama.cpp's default too), else the
    # model's dtype; or fp32, fp16, bf16. The arithmetic stays in the model's dtype.
    kv_cache_dtype: str = "auto"

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            # the quantized kernels, the decode attention and the norms compute in fp32, so a bf16
            # model there only adds casts and the torch attention: on a Zen 4 EPYC with AVX512-BF16,
            # decode steps of 1/8/32 sequences took 14.9/36.4/108.9 ms in fp32 against 26.5/53.0/144.6
            # in bf16, and 512-token prefill chunks 1.02 s against 1.07 (benchmarks/step_time.py --dtype)
            if self.runs_quantized_kernels():
                return torch.float32
            return torch.bfloat16 if bf16_is_fast(self.device) else torch.float32
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: expected auto, bf16, fp16 or fp32")
        return DTYPES[self.dtype]

    def kv_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The KV cache's element type for a model computing in `model_dtype`."""
        if self.kv_cache_dtype == "auto":
            cpu_kernel = (self.device == "cpu" and model_dtype == torch.float32
                          and self.attention_backend in ("auto", "cpu") and fast_library() is not None)
            return torch.float16 if cpu_kernel else model_dtype
        if self.kv_cache_dtype not in DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}: expected auto, fp32, fp16 or bf16")
        return DTYPES[self.kv_cache_dtype]

    def runs_quantized_kernels(self) -> bool:
        """The model is a GGUF whose weights stay quantized on the CPU kernels (load_checkpoint's rule)."""
        try:
            kind, _ = resolve_model(self.model)
            return kind == "gguf" and quantized_kernels_usable(self.weights_mode())
        except ModelLoadError:
            return False   # loading the model says why

    def int8_activations(self) -> bool:
        if self.kernel_activations not in ("int16", "int8"):
            raise ValueError(f"unknown kernel_activations {self.kernel_activations!r}: expected int16 or int8")
        return self.kernel_activations == "int8"

    def weights_mode(self) -> str:
        """auto/dense/quantized as load_checkpoint takes it: the quantized kernels run on the CPU only."""
        if self.weights not in ("auto", "dense", "quantized"):
            raise ValueError(f"unknown weights {self.weights!r}: expected auto, dense or quantized")
        if self.device != "cpu" and self.weights == "quantized":
            raise ValueError(f"weights=quantized runs on the CPU, not on {self.device}")
        return "dense" if self.device != "cpu" else self.weights


def bf16_is_fast(device: str) -> bool:
    """bf16 matmuls are fast only with hardware support; without it they run several times slower."""
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
