"""The quantized-weight kernels (engine/csrc/qlinear.c): plain C, loaded with ctypes by
engine/quantized_linear.py. Optional: where no C compiler is found the install goes on and the
engine dequantizes GGUF weights instead (one log line says so). Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("engine._qlinear", sources=["engine/csrc/qlinear.c"],
                             extra_compile_args=["-O3", "-std=gnu11", "-pthread"], extra_link_args=["-pthread"],
                             libraries=["m"], optional=True)])
