"""The CPU kernels (engine/kernels/csrc: linear layers on quantized weights, paged decode attention): plain C,
loaded with ctypes by engine/kernels/cpu_kernels.py. Optional: where no C compiler is found the install goes
on and the engine dequantizes GGUF weights and gathers KV for SDPA instead (one log line says so).
Everything else is in pyproject.toml."""

from setuptools import Extension, setup

SOURCES = ("isa", "thread_pool", "gemm_tile", "qlinear", "qlinear_x16", "paged_attention", "prefill_attention", "rms_norm", "rope_store", "decode_layer")

setup(ext_modules=[Extension("engine.kernels._cpu_kernels", sources=[f"engine/kernels/csrc/{name}.c" for name in SOURCES],
                             extra_compile_args=["-O3", "-std=gnu11", "-pthread"], extra_link_args=["-pthread"],
                             libraries=["m"], optional=True)])
