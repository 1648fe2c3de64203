"""Offline batch generation, vLLM style: LLM(model).generate(prompts, params)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from engine.engine_config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_token_ids: int
    text: str
    token_ids: list[int]
    finish_reason: str


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[Completion]:
        """Run every prompt to completion; results come back in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        return self._run(ids, use_tqdm)

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | None = None, use_tqdm: bool = False) -> list[Completion]:
        """Apply the model's chat template to one conversation or several, then generate."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [self.tokenizer.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, params, use_tqdm)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[Completion]:
        done: dict[str, Completion] = {}
        with tqdm(total=len(request_ids), desc="generate", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = Completion(out.request_id, out.num_prompt_tokens, out.text,
                                                          out.token_ids, out.finish_reason or "")
                        bar.update(1)
        return [done[i] for i in request_ids]
