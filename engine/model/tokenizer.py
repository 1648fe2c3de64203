"""Tokenizers: the checkpoint's own (from a GGUF or an HF directory) or a byte-level one for presets,
each with its chat template: the model's own where it has one (engine/model/chat_template.py), else ours."""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from engine.model.chat_template import ChatTemplate, ChatTemplateError, SpecialTokens, builtin_template
from engine.errors import ModelLoadError

log = logging.getLogger(__name__)


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    chat_template: str | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            variables: dict[str, Any] | None = None) -> list[int]: ...


class HFTokenizer:
    """A transformers fast tokenizer; for GGUF files transformers rebuilds it from the file's metadata.

    chat_template: the model's own template's source, None where it has none (then ours applies)."""

    def __init__(self, tokenizer: Any, extra_eos: tuple[int, ...] = (), template: ChatTemplate | None = None) -> None:
        self._tok = tokenizer
        self.template = template or builtin_template()
        self.chat_template = None if self.template.builtin else self.template.source
        eos = {tokenizer.eos_token_id, *extra_eos, *self.template.stop_tokens(tokenizer.get_added_vocab())} - {None}
        self.eos_token_ids = tuple(sorted(eos))

    @property
    def hf(self) -> Any:
        """The transformers tokenizer (what xgrammar reads the vocabulary from)."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True)

    def encode_plain(self, text: str) -> list[int]:
        """The text's tokens alone, no BOS (a piece inside an output)."""
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            variables: dict[str, Any] | None = None) -> list[int]:
        return self.encode_chat(self.render_chat(messages, tools, variables))

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    variables: dict[str, Any] | None = None) -> str:
        return self.template.render(messages, tools=tools, variables=variables)

    def encode_chat(self, text: str) -> list[int]:
        """The model's own template writes its BOS where it wants one (as transformers, no special tokens
        are added to it); ours is a plain prompt, which gets them."""
        return self._tok.encode(text, add_special_tokens=self.template.builtin)


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

    def byte_vocabulary(self, vocab_size: int) -> list[bytes]:
        """Each id's bytes, for xgrammar's raw vocabulary: b"" for the special and unused ids."""
        return [bytes([i - self.OFFSET]) if self.OFFSET <= i < 256 + self.OFFSET else b"" for i in range(vocab_size)]

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            variables: dict[str, Any] | None = None) -> list[int]:
        return self.encode_chat(self.render_chat(messages, tools, variables))

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    variables: dict[str, Any] | None = None) -> str:
        return builtin_template().render(messages, tools=tools, variables=variables)

    def encode_chat(self, text: str) -> list[int]:
        return self.encode(text)


def load_tokenizer(kind: str, location: str, vocab_size: int, eos_token_ids: tuple[int, ...] = (),
                   gguf_metadata: dict[str, Any] | None = None) -> Tokenizer:
    """gguf_metadata: the GGUF's key/values where the caller has read them already (else read here)."""
    if kind == "dummy":
        return ByteTokenizer(vocab_size) if vocab_size >= 259 else _TinyTokenizer(vocab_size)
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if kind == "gguf":
            # the fast tokenizer rebuilt from the file's vocabulary, merges and special tokens; AutoTokenizer
            # would first read the whole file again for a config to pick a class by (12 s of a 1.5B Qwen's
            # start on a 2-core Xeon), a class that changes nothing once the tokenizer comes from the GGUF
            tok = PreTrainedTokenizerFast.from_pretrained(os.path.dirname(location) or ".",
                                                          gguf_file=os.path.basename(location))
        else:
            tok = AutoTokenizer.from_pretrained(location)
    except Exception as e:  # transformers raises many types for missing or broken files
        raise ModelLoadError(f"cannot load the tokenizer of {location}: {type(e).__name__}: {e}") from e
    return HFTokenizer(tok, eos_token_ids, model_template(kind, location, tok, gguf_metadata))


def special_tokens(tok: Any) -> SpecialTokens:
    return SpecialTokens(tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token)


def model_template(kind: str, location: str, tok: Any, gguf_metadata: dict[str, Any] | None) -> ChatTemplate | None:
    """The model's own chat template, checked at load (a template the sandbox refuses is a load error);
    None where it has none. The log says which template serves chat requests."""
    source, origin = _template_source(kind, location, tok, gguf_metadata)
    if source is None:
        log.info("chat template: built-in (role: content lines); %s has none of its own", location)
        return None
    try:
        template = ChatTemplate(source, origin, special_tokens(tok))
        template.check_safe()
    except ChatTemplateError as e:
        raise ModelLoadError(f"{location}: {e}") from e
    log.info("chat template: the model's own, from %s", origin)
    return template


def _template_source(kind: str, location: str, tok: Any,
                     gguf_metadata: dict[str, Any] | None) -> tuple[str | None, str]:
    if kind == "gguf":
        if gguf_metadata is None:
            from engine.model.checkpoint import read_gguf_metadata
            gguf_metadata = read_gguf_metadata(location)
        return gguf_metadata.get("tokenizer.chat_template"), "the GGUF's tokenizer.chat_template"
    source = getattr(tok, "chat_template", None)
    if isinstance(source, dict):   # named templates (tokenizer_config.json's list form): the default one
        source = source.get("default")
    jinja_file = os.path.join(location, "chat_template.jinja")
    return source, "chat_template.jinja" if os.path.isfile(jinja_file) else "tokenizer_config.json"


class _TinyTokenizer(ByteTokenizer):
    """Bytes folded into a small vocabulary, for the test presets."""

    byte_vocabulary = None     # an id is several bytes: no grammar can be held over it

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = (2,)

    def encode(self, text: str) -> list[int]:
        return [self.OFFSET + b % (self.vocab_size - self.OFFSET) for b in text.encode()]
