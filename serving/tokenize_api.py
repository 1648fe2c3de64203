"""POST /tokenize and /detokenize with vLLM's request and response shapes: a prompt (or chat messages
through the model's chat template, as /v1/chat/completions renders them) to token ids, and ids back to
text. Errors have the rest of the API's OpenAI shape."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import ConfigDict, Field, model_validator

from engine.model.chat_template import builtin_template
from serving.openai_protocol import ChatMessage, NullIsAbsent
from serving.request_fields import field_error, note_ignored


class _Body(NullIsAbsent):
    model_config = ConfigDict(extra="allow")   # other fields are ignored and counted, as on /v1

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class TokenizeRequest(_Body):
    """`prompt` (with `add_special_tokens`) or `messages` (with `add_generation_prompt`), not both."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool = True
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise field_error(type(self).__name__, "prompt", "send either prompt or messages", None)
        if self.messages is not None and not self.messages:
            raise field_error(type(self).__name__, "messages", "messages must not be empty", [])
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] = Field()


def add_tokenize_routes(app: FastAPI, state: Any) -> None:
    """Registers the two routes on the API's app; `state` is its ServerState."""
    from serving.api_server import ApiError   # (api_server registers these routes)

    def engine_and_check(body: _Body):
        loop = state.require_loop()
        name = state.config.served_model_name
        if body.model is not None and body.model != name:
            raise ApiError(400, f"model {body.model!r} is not served here; this server serves {name!r}",
                           param="model", code="model_not_found")
        note_ignored(body.ignored_fields, loop.engine)
        return loop.engine

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        engine = engine_and_check(body)
        tokenizer = engine.tokenizer
        if body.messages is not None:
            messages = [m.as_template_input() for m in body.messages]
            try:
                ids = chat_ids(tokenizer, messages, body.add_generation_prompt)
            except Exception as e:
                raise ApiError(400, f"cannot apply the chat template: {e}", param="messages") from e
        else:
            ids = encode(tokenizer, body.prompt, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids,
                "token_strs": token_strs(tokenizer, ids) if body.return_token_strs else None}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        engine = engine_and_check(body)
        vocab = engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:8]} are outside the vocabulary [0, {vocab})", param="tokens")
        return {"prompt": engine.tokenizer.decode(body.tokens)}


def _hf(tokenizer: Any) -> Any:
    """The transformers tokenizer under ours (engine/model/tokenizer.py's HFTokenizer), or None."""
    return getattr(tokenizer, "_tok", None)


def encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    if add_special_tokens or _hf(tokenizer) is None:   # the byte tokenizers add no special tokens
        return tokenizer.encode(text)
    return _hf(tokenizer).encode(text, add_special_tokens=False)


def chat_ids(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """The ids /v1/chat/completions would prefill for these messages (the same call), or the same
    rendering without the assistant turn's opening."""
    if add_generation_prompt:
        return tokenizer.apply_chat_template(messages)
    template = getattr(tokenizer, "template", None) or builtin_template()
    text = template.render(messages, add_generation_prompt=False)
    # as HFTokenizer.apply_chat_template: the model's own template writes its own BOS, ours gets one
    return encode(tokenizer, text, add_special_tokens=template.builtin)


def token_strs(tokenizer: Any, ids: list[int]) -> list[str]:
    hf = _hf(tokenizer)
    if hf is not None:
        return [str(t) for t in hf.convert_ids_to_tokens(ids)]
    return [tokenizer.decode([i]) for i in ids]
