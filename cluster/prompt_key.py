"""A request's routing key at the ingress: its prompt's token ids as the replica will see them
(the same tokenizer and chat template), hence its prefix blocks' keys.

A body the ingress cannot read is routed by load alone: the replica it reaches answers it with
the daemon's own OpenAI-style error, so the ingress never judges requests differently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


from cluster.prefix_index import prompt_block_keys
from engine.model.tokenizer import Tokenizer
from serving.openai_protocol import ChatCompletionRequest, CompletionRequest


@dataclass(frozen=True)
class RouteKey:
    block_keys: list[bytes]
    prompt_tokens: int
    output_tokens: int         # max_tokens (or the server's default): the most it may generate


NO_KEY = RouteKey([], 0, 0)


def route_key(path: str, body: bytes, tokenizer: Tokenizer, block_size: int, default_max_tokens: int) -> RouteKey:
    try:
        data = json.loads(body)
        ids = _prompt_ids(path, data, tokenizer)
        output = data.get("max_tokens") or data.get("max_completion_tokens") or default_max_tokens
        keys = prompt_block_keys(ids, block_size, data.get("cache_salt")) if ids is not None else None
    except Exception:   # bad JSON, fields or template: the replica it reaches says what is wrong
        return NO_KEY
    if keys is None or not isinstance(output, int):
        return NO_KEY
    return RouteKey(keys, len(ids), output)


def _prompt_ids(path: str, data: Any, tokenizer: Tokenizer) -> list[int] | None:
    if path.endswith("/chat/completions"):
        chat = ChatCompletionRequest.model_validate(data)
        prompt: str | list[int] = tokenizer.apply_chat_template([m.as_template_input() for m in chat.messages])
    elif path.endswith("/completions"):
        prompts = CompletionRequest.model_validate(data).prompts()
        prompt = prompts[0]     # a batch is keyed by its first prompt: the replica computes them all
    else:
        return None
    if isinstance(prompt, str):
        return tokenizer.encode(prompt) if prompt else []
    return list(prompt)
