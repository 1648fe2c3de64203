"""OpenAI-compatible request bodies (the fields we serve) and the error shape clients expect.

A null is the same as an absent field. What each OpenAI field that is not served here does (ignored,
or a 400 unless it holds its habitual default) is serving/request_fields.py's table; fields outside
OpenAI's schema that are not ours are accepted, ignored and counted (`ignored_fields`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.errors import InvalidRequestError
from engine.sampling_params import MAX_LOGPROBS, SamplingParams

MAX_CHOICES = 16           # n and best_of: each choice is a sequence in the engine
MAX_PROMPTS = 64           # prompts in one /v1/completions request
from serving import request_fields
from serving.request_fields import Rule, field_error
from serving.structured_fields import StructuredFields
from serving.tool_fields import MessageToolCall, ToolFields


class NullIsAbsent(BaseModel):
    """A model whose null fields read as absent: their defaults apply (as OpenAI, vLLM and llama.cpp)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class StreamOptions(NullIsAbsent):
    include_usage: bool = False


class SamplingFields(StructuredFields):
    """Fields shared by /v1/completions and /v1/chat/completions (the output constraints:
    serving/structured_fields.py). Nulls read as absent; OpenAI's fields we do not serve follow OPENAI_FIELDS
    (serving/request_fields.py); other fields are kept as extras, ignored, and named by `ignored_fields` for
    the API to count."""

    model_config = ConfigDict(extra="allow")
    OPENAI_FIELDS: ClassVar[dict[str, Rule]] = {}

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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0     # vLLM's extension
    min_p: float = 0.0                  # vLLM's extension
    logit_bias: dict[str, float] | None = None   # token id (a string, JSON object keys are) -> bias in [-100, 100]
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)   # vLLM's extension

    @model_validator(mode="before")
    @classmethod
    def _screen_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return request_fields.screen(cls.__name__, cls.OPENAI_FIELDS, cls.model_fields, data)

    @field_validator("n")
    @classmethod
    def _choices_within_bound(cls, n: int) -> int:
        if not 1 <= n <= MAX_CHOICES:
            raise ValueError(f"n must be between 1 and {MAX_CHOICES}")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            try:
                int(key)
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids (integers), got {key!r}") from None
        return bias

    @property
    def ignored_fields(self) -> list[str]:
        """The body's fields that have no effect here and are not a habitual default: counted by the API."""
        return sorted(self.model_extra or {})

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """(SamplingParams.logprobs, SamplingParams.prompt_logprobs): each endpoint reads its own fields."""
        return None, self.prompt_logprobs

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        logprobs, prompt_logprobs = self.logprob_counts()
        return SamplingParams(
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            stop=tuple(stop), stop_token_ids=tuple(self.stop_token_ids or ()), min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos, min_p=self.min_p, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            logit_bias=tuple((int(t), b) for t, b in (self.logit_bias or {}).items()),
            logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def candidates(self) -> int:
        """Sequences generated per prompt."""
        return self.n

    @property
    def wants_logprobs(self) -> bool:
        """Whether replies carry logprobs (a best_of ranking computes them either way)."""
        return self.sampling_params(1).logprobs is not None


class CompletionRequest(SamplingFields):
    OPENAI_FIELDS: ClassVar[dict[str, Rule]] = request_fields.COMPLETION_FIELDS

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)   # top-N per generated token
    echo: bool = False                  # the reply starts with the prompt
    best_of: int | None = None

    @model_validator(mode="after")
    def _best_of_covers_n(self) -> CompletionRequest:
        if self.best_of is not None and not self.n <= self.best_of <= MAX_CHOICES:
            raise field_error(type(self).__name__, "best_of", f"best_of must be between n ({self.n}) and "
                              f"{MAX_CHOICES}", self.best_of)
        if self.stream and self.candidates > self.n:
            raise field_error(type(self).__name__, "best_of", "best_of above n cannot be streamed", self.best_of)
        return self

    @property
    def candidates(self) -> int:
        """Sequences generated per prompt: best_of, else n."""
        return self.best_of or self.n

    def logprob_counts(self) -> tuple[int | None, int | None]:
        prompt_logprobs = self.prompt_logprobs
        if prompt_logprobs is None and self.echo:   # as OpenAI: echo with logprobs scores the prompt too
            prompt_logprobs = self.logprobs
        return self.logprobs, prompt_logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each a string or token ids: one, or a batch (a list of strings or of id lists)."""
        batch = isinstance(self.prompt, list) and bool(self.prompt) and all(isinstance(p, (str, list))
                                                                              for p in self.prompt)
        prompts = list(self.prompt) if batch else [self.prompt]
        if len(prompts) > MAX_PROMPTS:
            raise InvalidRequestError(f"a batch holds at most {MAX_PROMPTS} prompts", "prompt")
        return prompts


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """Fields beyond these (an SDK echoing a reply back sends `refusal`, `annotations`, `audio`) are kept as
    extras, ignored and counted as `messages[].NAME` where not null or empty."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None     # an assistant's calls
    tool_call_id: str | None = None                      # a tool's result: the call it answers
    reasoning_content: str | None = None                 # an assistant's reasoning, for templates that show it

    @model_validator(mode="after")
    def _fields_of_its_role(self) -> "ChatMessage":
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def as_template_input(self) -> dict[str, Any]:
        """The message as transformers gives templates: what was sent, a call's arguments as an object."""
        content = self.content if isinstance(self.content, str) or self.content is None else \
            "".join(p.text for p in self.content)
        # "" rather than null: templates test `'x' in message.content` or concatenate it (Qwen 3, Phi-4-mini)
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                                   "content": content if content is not None else ""}
        if self.tool_calls:
            message["tool_calls"] = [call.as_template_input() for call in self.tool_calls]
        for key in ("name", "tool_call_id", "reasoning_content"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class ChatCompletionRequest(ToolFields, SamplingFields):
    OPENAI_FIELDS: ClassVar[dict[str, Rule]] = request_fields.CHAT_FIELDS

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise field_error(type(self).__name__, "top_logprobs", "top_logprobs needs logprobs: true",
                              self.top_logprobs)
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, self.prompt_logprobs

    @property
    def ignored_fields(self) -> list[str]:
        in_messages = {f"messages[].{k}" for m in self.messages for k, v in (m.model_extra or {}).items()
                       if v not in (None, "", [], {})}
        return sorted(set(super().ignored_fields) | in_messages)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
