"""A model's own chat template (Jinja, from a GGUF's `tokenizer.chat_template` or an HF tokenizer's
files), rendered in Jinja's immutable sandbox: a template ships with a downloaded model and is
untrusted input, so it may not reach Python internals, mutate what it is given, or blow up memory."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# where a model has none: the format the byte-level presets always used
BUILTIN_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant: {% endif %}")

# end-of-turn tokens of known chat formats (llama.cpp's end-of-generation list): a template that closes
# turns with one makes it a stop token, as models trained on it emit it when done
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                      "<|end_of_text|>", "<EOT>", "<｜end▁of▁sentence｜>", "<|return|>")

MAX_REPEAT = 1 << 20   # longest string or list a template may build with `*`


class ChatTemplateError(ValueError):
    """A template that does not compile, does something the sandbox refuses, or rejects a conversation."""


@dataclass(frozen=True)
class SpecialTokens:
    """The special tokens' texts a template reads as variables (bos_token, eos_token, ...)."""

    bos_token: str | None = None
    eos_token: str | None = None
    unk_token: str | None = None
    pad_token: str | None = None


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, refusing unsafe attributes at once, with no `**` and a bounded `*` (a template
    could ask for 'x' * 10**12)."""

    intercepted_binops = frozenset({"*", "**"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Jinja's sandbox renders a refused attribute as empty and fails only where it is used further:
        # refuse at the access, so that a probing template is an error, not a silent blank
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is unsafe")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            raise SecurityError("the ** operator is not allowed in a chat template")
        sized, count = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(sized, (str, list, tuple)) and isinstance(count, int) and len(sized) * count > MAX_REPEAT:
            raise SecurityError(f"a chat template may not build sequences longer than {MAX_REPEAT}")
        return super().call_binop(context, operator, left, right)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` without underscore attributes (a route to CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _check_public(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_public(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_public(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a chat template may not set the attribute {name!r} on a namespace")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker): rendered as is."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must keep as they are
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> _Sandbox:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, namespace=_Namespace,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env


class ChatTemplate:
    """A compiled template; `origin` says where it came from ("built-in" for ours)."""

    def __init__(self, source: str, origin: str, special: SpecialTokens = SpecialTokens()) -> None:
        self.source, self.origin, self.special = source, origin, special
        try:
            self._template = _environment().from_string(source)
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template from {origin} does not compile: {e}") from e

    @property
    def builtin(self) -> bool:
        return self.origin == "built-in"

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, variables: dict[str, Any] | None = None) -> str:
        """`tools`: OpenAI's tool list, as transformers passes it; `variables`: a client's
        chat_template_kwargs (e.g. enable_thinking), which may not replace what the template is given."""
        given = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                 **{k: v for k, v in vars(self.special).items() if v is not None}}
        if tools is not None:
            given["tools"] = tools
        clash = sorted(set(variables or {}) & (set(given) | {"tools"}))
        if clash:
            raise ChatTemplateError(f"chat_template_kwargs may not set {', '.join(clash)}")
        try:
            return self._template.render(**(variables or {}), **given)
        except SecurityError as e:
            raise ChatTemplateError(f"the chat template from {self.origin} was refused: {e}") from e
        except TemplateError as e:
            raise ChatTemplateError(f"the chat template from {self.origin} rejected the conversation: {e}") from e

    def check_safe(self) -> None:
        """Render a one-message conversation: a template that reaches for what the sandbox refuses is
        found at load, not at a client's first request. Other failures are the conversation's, not the
        template's (some templates reject a conversation without a system message)."""
        try:
            self.render([{"role": "user", "content": "hi"}])
        except ChatTemplateError as e:
            if isinstance(e.__cause__, SecurityError):
                raise

    @property
    def mentions_tools(self) -> bool:
        """Whether the template reads a `tools` variable at all (one that does not cannot show them)."""
        return "tools" in self.source

    def stop_tokens(self, added_vocab: dict[str, int]) -> tuple[int, ...]:
        """The end-of-turn special tokens (of `added_vocab`: text -> id) this template writes."""
        return tuple(sorted(added_vocab[t] for t in END_OF_TURN_TOKENS if t in added_vocab and t in self.source))


@cache
def builtin_template() -> ChatTemplate:
    """Ours, for models without one: it reads no special tokens, so one compiled copy serves all."""
    return ChatTemplate(BUILTIN_TEMPLATE, "built-in")
