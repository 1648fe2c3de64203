"""Tokenizers: the checkpoint's own (from a GGUF or an HF directory) or a byte-level one for presets."""

from __future__ import annotations

import os
from typing import Any, Protocol

from engine.errors import ModelLoadError


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    chat_template: str | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]: ...


class HFTokenizer:
    """A transformers fast tokenizer; for GGUF files transformers rebuilds it from the file's metadata."""

    def __init__(self, tokenizer: Any, extra_eos: tuple[int, ...] = ()) -> None:
        self._tok = tokenizer
        self.chat_template = getattr(tokenizer, "chat_template", None)
        eos = {tokenizer.eos_token_id, *extra_eos} - {None}
        self.eos_token_ids = tuple(sorted(eos))

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        if not self.chat_template:
            raise ValueError("this model's tokenizer has no chat template")
        out = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


class ByteTokenizer:
    """UTF-8 bytes as token ids 3..258 (0 pad, 1 bos, 2 eos), for random-weight presets."""

    OFFSET = 3
    chat_template = None

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 256 + self.OFFSET:
            raise ValueError("ByteTokenizer needs a vocabulary of at least 259 tokens")
        self.eos_token_ids = (2,)

    def encode(self, text: str) -> list[int]:
        return [b + self.OFFSET for b in text.encode()]

    def decode(self, ids: list[int]) -> str:
        data = bytes(i - self.OFFSET for i in ids if self.OFFSET <= i < 256 + self.OFFSET)
        return data.decode(errors="replace")

    def apply_chat_template(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.encode("".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: ")


def load_tokenizer(kind: str, location: str, vocab_size: int, eos_token_ids: tuple[int, ...] = ()) -> Tokenizer:
    if kind == "dummy":
        return ByteTokenizer(vocab_size) if vocab_size >= 259 else _TinyTokenizer(vocab_size)
    from transformers import AutoTokenizer

    try:
        if kind == "gguf":
            tok = AutoTokenizer.from_pretrained(os.path.dirname(location) or ".",
                                                gguf_file=os.path.basename(location))
        else:
            tok = AutoTokenizer.from_pretrained(location)
    except Exception as e:  # transformers raises many types for missing or broken files
        raise ModelLoadError(f"cannot load the tokenizer of {location}: {type(e).__name__}: {e}") from e
    return HFTokenizer(tok, eos_token_ids)


class _TinyTokenizer(ByteTokenizer):
    """Bytes folded into a small vocabulary, for the test presets."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = (2,)

    def encode(self, text: str) -> list[int]:
        return [self.OFFSET + b % (self.vocab_size - self.OFFSET) for b in text.encode()]
