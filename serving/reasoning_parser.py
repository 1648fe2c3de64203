"""Reasoning split off a reply: Qwen 3's `<think>...</think>` and the families that copy it.

Three cases, told apart by the prompt the reply continues (`for_prompt`):
- the model opens the block itself (Qwen 3's template): reasoning is what a leading `<think>` ...
  `</think>` holds; a reply that does not start with `<think>` has none;
- the generation prompt opened it already (DeepSeek-R1's template writes `<think>\\n`): the reply starts
  inside the reasoning and only the end tag appears;
- the prompt closed an empty block (Qwen 3 with `enable_thinking: false`): no reasoning at all.

Reasoning is stripped of the whitespace around it, content of what follows `</think>`. A streamed reply
comes out the same as the whole one: text that may be the start or the end tag is held until it is
decided. Tool calls are parsed from the content only (serving/tool_calls/reply.py): a call a model
drafts while reasoning is not a call."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from serving.tool_calls.content import ContentShaper
from serving.tool_calls.json_object import WHITESPACE
from serving.tool_calls.scanner import partial_at_end

THINK_START, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    start: str = THINK_START
    end: str = THINK_END
    opened: bool = False        # the reply begins inside the reasoning (the prompt wrote the start tag)

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning or None, content) of a whole reply."""
        streamer = self.streamer()
        reasoning, content = streamer.feed(text)
        more_reasoning, more_content = streamer.finish()
        return (reasoning + more_reasoning) or None, content + more_content

    def streamer(self) -> ReasoningStreamer:
        return ReasoningStreamer(self)

    def for_prompt(self, prompt: str) -> ReasoningParser | None:
        """The parser for a reply to `prompt` (the rendered chat prompt): opened where the prompt ends
        with the start tag, None where it ends with a closed block (reasoning turned off)."""
        tail = prompt.rstrip(WHITESPACE)
        if tail.endswith(self.end):
            return None
        return replace(self, opened=tail.endswith(self.start))

    def after_reasoning(self, tag_format: dict[str, Any]) -> dict[str, Any]:
        """An xgrammar structural tag that leaves the reasoning free and applies `tag_format` (a
        structural tag, or one of its formats such as {"type": "json_schema", "json_schema": ...})
        to what follows it."""
        inner = tag_format["format"] if tag_format.get("type") == "structural_tag" else tag_format
        think = {"type": "tag", "begin": "" if self.opened else self.start, "content": {"type": "any_text"},
                 "end": self.end}
        gap = {"type": "regex", "pattern": r"\s*"}       # Qwen 3 writes "\n\n" after the end tag
        return {"type": "structural_tag", "format": {"type": "sequence", "elements": [think, gap, inner]}}


class ReasoningStreamer:
    """feed(delta) -> (reasoning delta, content delta); finish() gives what was held back."""

    def __init__(self, parser: ReasoningParser) -> None:
        self._parser = parser
        self._state = "reasoning" if parser.opened else "probe"
        self._pending = ""
        self._reasoning = ContentShaper()

    def feed(self, text_delta: str) -> tuple[str, str]:
        self._pending += text_delta
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        out = self._run(final=True)
        self._reasoning.finish()
        return out

    def _run(self, final: bool) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(final, reasoning, content):
            pass
        return "".join(reasoning), "".join(content)

    def _step(self, final: bool, reasoning: list[str], content: list[str]) -> bool:
        """One move of the state machine; False once it waits for more text."""
        start, end = self._parser.start, self._parser.end
        if self._state == "probe":              # does the reply open a block?
            head = self._pending.lstrip(WHITESPACE)
            if head.startswith(start):
                self._pending, self._state = head[len(start):], "reasoning"
                return True
            if start.startswith(head) and not final:
                return False
            self._state = "content"
            return True
        if self._state == "reasoning":
            at = self._pending.find(end)
            if at < 0:
                cut = len(self._pending) if final else partial_at_end(end, self._pending, 0)
                reasoning.append(self._reasoning.text(self._pending[:cut]))
                self._pending = self._pending[cut:]
                return False
            reasoning.append(self._reasoning.text(self._pending[:at]))
            self._reasoning.finish()
            self._pending, self._state = self._pending[at + len(end):], "after"
            return True
        if self._state == "after":              # the whitespace after the end tag is not content
            self._pending = self._pending.lstrip(WHITESPACE)
            if not self._pending:
                return False
            self._state = "content"
            return True
        content.append(self._pending)
        self._pending = ""
        return False


def reasoning_for_template(source: str | None) -> ReasoningParser | None:
    """The reasoning parser for a chat template that writes think blocks; None where it writes none.
    Whether its generation prompt opens the block is read from the template rendered for a one-message
    conversation; `for_prompt` decides it again for each request's prompt (template variables such as
    enable_thinking change it)."""
    if not source or THINK_START not in source or THINK_END not in source:
        return None
    parser = ReasoningParser()
    prompt = _generation_prompt(source)
    opened = prompt is not None and prompt.rstrip(WHITESPACE).endswith(THINK_START)
    return replace(parser, opened=opened)


def _generation_prompt(source: str) -> str | None:
    from engine.model.chat_template import ChatTemplate

    try:
        return ChatTemplate(source, "reasoning detection").render([{"role": "user", "content": "hi"}])
    except Exception:  # a template that fails on this probe (in whatever way) says nothing of its prompt
        return None
