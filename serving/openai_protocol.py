"""OpenAI-compatible request bodies (the fields we serve) and the error shape clients expect."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, description="most tokens to generate")
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    slo_class: str | None = None    # the request's SLO class (engine/slo_class.py); wins over X-SLO-Class
    cache_salt: str | None = Field(default=None, min_length=1, description=(
        "as vLLM: prefix-cache blocks are shared only among requests with the same salt (a tenant)"))

    @field_validator("n")
    @classmethod
    def _single_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported; send separate requests for more choices")
        return n

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            stop=tuple(stop), stop_token_ids=tuple(self.stop_token_ids or ()), min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str]

    def prompt_input(self) -> str | list[int]:
        if isinstance(self.prompt, list) and self.prompt and all(isinstance(p, str) for p in self.prompt):
            if len(self.prompt) != 1:
                raise InvalidRequestError("a batch of prompts is not supported; send one prompt per request",
                                          "prompt")
            return self.prompt[0]
        return self.prompt


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, Any]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
