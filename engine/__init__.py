"""The serving engine: paged KV cache, iteration-level scheduling, chunked prefill, mixed batches."""

import os

# torch's OpenMP threads otherwise spin for a while after every op, holding a core that the CPU
# kernels' own pool wants next (docs/cpu_kernels.md, "Threads"); libgomp reads this once, when torch
# is first imported, so it takes effect where the engine is imported before torch (the command line,
# bench_common)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine.engine_config import EngineConfig
from engine.errors import EngineError, InvalidRequestError, ModelLoadError
from engine.llm import LLM, Completion
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StepRecord
from engine.sampling_params import SamplingParams

__all__ = ["EngineConfig", "EngineError", "InvalidRequestError", "ModelLoadError", "LLM", "Completion",
           "LLMEngine", "RequestOutput", "StepRecord", "SamplingParams"]
