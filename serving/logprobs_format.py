"""Token logprobs in OpenAI's reply shapes: the completions API's parallel lists and the chat API's
`content` entries, each token shown as its text (and, for chat, its UTF-8 bytes)."""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from engine.logprobs import TokenLogprob
from engine.model.tokenizer import Tokenizer


CONTEXT_TOKENS = 1      # the token before one decides how it reads (a leading space a lone decode drops)


_TEXTS: WeakKeyDictionary = WeakKeyDictionary()     # tokenizer -> {(token id, after another token): its text}


def _texts(tokenizer: Tokenizer) -> dict[tuple[int, bool], str]:
    return _TEXTS.setdefault(tokenizer, {})


def token_text(tokenizer: Tokenizer, token_id: int, before: list[int] = ()) -> str:
    """The text `token_id` adds to a reply: alone at its start, else after any other token (decoded once
    after a fixed neighbour and cached, so a reply's tokens join to its text, leading spaces included,
    at a dictionary lookup each)."""
    key = (token_id, bool(before))
    cache = _texts(tokenizer)
    text = cache.get(key)
    if text is not None:
        return text
    if not before:
        text = cache[key] = tokenizer.decode([token_id])
        return text
    anchor = tokenizer.decode([before[-1]])
    pair = tokenizer.decode([before[-1], token_id])
    if "\ufffd" in anchor or not pair.startswith(anchor):    # a byte sequence split across tokens: not cacheable
        return pair[len(anchor):] if pair.startswith(anchor) else tokenizer.decode([token_id])
    text = cache[key] = pair[len(anchor):]
    return text


def completion_logprobs(tokenizer: Tokenizer, entries: list[tuple[int, TokenLogprob | None]],
                        before: list[int], offset: int = 0) -> dict[str, Any]:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"} of (token id, its logprob entry) pairs
    following the tokens `before`; an entry of None (a prompt's first token, which nothing scores) has null
    logprobs. `offset`: where the first token's text starts in the reply's text."""
    tokens, logprobs, tops, offsets = [], [], [], []
    before = list(before)
    for token_id, entry in entries:
        text = token_text(tokenizer, token_id, before)
        tokens.append(text)
        logprobs.append(entry.logprob if entry is not None else None)
        tops.append({token_text(tokenizer, t, before): lp for t, lp in entry.top} if entry is not None and entry.top
                    else None)
        offsets.append(offset)
        offset += len(text)
        before.append(token_id)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob], before: list[int]) -> dict[str, Any]:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}."""
    before = list(before)

    def one(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token_id, before)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for e in entries:
        content.append({**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]})
        before.append(e.token_id)
    return {"content": content}


def prompt_entries(prompt_ids: list[int], scored: tuple[TokenLogprob, ...] | None) -> list[tuple[int, TokenLogprob | None]]:
    """A prompt's tokens with their logprob entries: the first unscored, then each scored one (none where
    the request asked for no prompt logprobs)."""
    scored = scored or ()
    return [(t, scored[i - 1] if 0 < i <= len(scored) else None) for i, t in enumerate(prompt_ids)]


def generated_entries(entries: tuple[TokenLogprob, ...]) -> list[tuple[int, TokenLogprob | None]]:
    return [(e.token_id, e) for e in entries]


def vllm_prompt_logprobs(tokenizer: Tokenizer, scored: tuple[TokenLogprob, ...]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then per token a map from token id to its
    logprob and text, the prompt token's own entry first, then the position's most likely ones."""
    def entry(token_id: int, logprob: float) -> tuple[str, dict[str, Any]]:
        return str(token_id), {"logprob": logprob, "decoded_token": token_text(tokenizer, token_id)}

    return [None, *({**dict([entry(s.token_id, s.logprob)]), **dict(entry(t, lp) for t, lp in s.top)}
                    for s in scored)]


class ReplyLogprobs:
    """A reply's logprobs as its outputs arrive: `take()` returns those not yet sent, in the endpoint's
    shape (None where the request asked for none), so a streamed reply carries the same entries as the
    whole one, spread over its chunks."""

    def __init__(self, tokenizer: Tokenizer, request, chat: bool, echo: str = "", wants: bool | None = None) -> None:
        self.tokenizer, self.request, self.chat, self.echo = tokenizer, request, chat, echo
        self.wants = request.params.logprobs is not None if wants is None else wants
        self.prompt_logprobs: list[dict[str, Any] | None] | None = None
        self._pending: list[tuple[int, TokenLogprob | None]] = []
        self._before: list[int] = []      # the tokens already shown, whose last few decide how the next read
        self._offset = 0
        self._first = True

    def add(self, out) -> None:
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = vllm_prompt_logprobs(self.tokenizer, out.prompt_logprobs)
        if self._first and self.echo and self.wants:
            self._pending += prompt_entries(self.request.prompt_token_ids, out.prompt_logprobs)
        self._first = False
        self._pending += generated_entries(out.logprobs)

    def take(self) -> dict[str, Any] | None:
        if not self.wants:
            return None
        pending, self._pending = self._pending, []
        before = self._before
        self._before = (before + [t for t, _ in pending])[-CONTEXT_TOKENS:]
        if self.chat:
            return chat_logprobs(self.tokenizer, [e for _, e in pending if e is not None], before)
        shaped = completion_logprobs(self.tokenizer, pending, before, self._offset)
        self._offset += sum(len(t) for t in shaped["tokens"])
        return shaped
