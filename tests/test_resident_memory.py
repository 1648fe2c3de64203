"""What the engine keeps resident besides its weights and KV (the memory bound of docs/llama_cpp.md: GGUF x 1.3 + the KV pool)."""

from __future__ import annotations

import subprocess
import sys

BUILD_AND_REPORT = """
import sys
from engine import LLM
LLM(kv_cache_memory_mb=16).generate(["Hi"])
print(sorted(m for m in ("torch._dynamo", "torch._inductor", "sympy") if m in sys.modules))
"""


def test_building_and_running_the_engine_does_not_import_torch_dynamo():
    """torch._dynamo, its inductor and sympy hold ~140 MB resident for the process's life; building the
    model on the meta device imports them where a constructor computes there (normal_, arange)."""
    out = subprocess.run([sys.executable, "-P", "-c", BUILD_AND_REPORT], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
