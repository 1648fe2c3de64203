"""The serving engine: paged KV cache, iteration-level scheduling, chunked prefill, mixed batches."""

from engine.engine_config import EngineConfig
from engine.errors import EngineError, InvalidRequestError, ModelLoadError
from engine.llm import LLM, Completion
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput, StepRecord
from engine.sampling_params import SamplingParams

__all__ = ["EngineConfig", "EngineError", "InvalidRequestError", "ModelLoadError", "LLM", "Completion",
           "LLMEngine", "RequestOutput", "StepRecord", "SamplingParams"]
