"""How one chat request is served: the prompt its model's template writes from the messages, the tools and
the client's chat_template_kwargs; the parsers of its reply (reasoning first, then tool calls); and the
grammar its output is held to (its tool_choice, or its response format once the reasoning ends)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError
from engine.model.chat_template import ChatTemplateError
from engine.structured.constraint import Constraint
from serving.openai_protocol import ChatCompletionRequest
from serving.reasoning_parser import ReasoningParser, reasoning_for_template
from serving.tool_calls import FORMAT_NAMES, ToolCallFormat, format_for_template, format_named
from serving.tool_calls.call import CallId
from serving.tool_calls.reply import ReplyStreamer

AUTO = "auto"
NONE = "none"
THINK = "think"
TOOL_CALL_PARSERS = (AUTO, NONE, *FORMAT_NAMES)
REASONING_PARSERS = (AUTO, NONE, THINK)


@dataclass(frozen=True)
class ChatParsers:
    """The server's choice of parsers: "auto" reads them off the model's chat template; a name forces one
    (serving/tool_calls FORMAT_NAMES; "think" for `<think>` reasoning); "none" turns one off."""

    tool_call_parser: str = AUTO
    reasoning_parser: str = AUTO

    def tool_format(self, template_source: str | None) -> ToolCallFormat | None:
        if self.tool_call_parser == NONE:
            return None
        if self.tool_call_parser == AUTO:
            return format_for_template(template_source)
        return format_named(self.tool_call_parser)

    def reasoning(self, template_source: str | None) -> ReasoningParser | None:
        if self.reasoning_parser == NONE:
            return None
        if self.reasoning_parser == AUTO:
            return reasoning_for_template(template_source)
        return ReasoningParser()


@dataclass(frozen=True)
class ChatPlan:
    prompt: list[int]
    constraint: Constraint | None
    reasoning: ReasoningParser | None
    tools: ToolCallFormat | None

    @property
    def shapes_reply(self) -> bool:
        """Whether the reply's text is parsed into reasoning, content and calls (else sent as it comes)."""
        return self.reasoning is not None or self.tools is not None

    def streamer(self, request_id: str) -> ReplyStreamer:
        return ReplyStreamer(self.reasoning, self.tools, self.call_id(request_id))

    def call_id(self, request_id: str) -> CallId:
        """Ids a streamed and a whole reply give alike; Mistral's templates take 9 alphanumerics only."""
        mistral = self.tools is not None and self.tools.name == "mistral"

        def call_id(index: int) -> str:
            digest = hashlib.sha256(f"{request_id}:{index}".encode()).hexdigest()
            return digest[:9] if mistral else f"call_{digest[:24]}"
        return call_id


def plan_chat(body: ChatCompletionRequest, tokenizer: Any, parsers: ChatParsers) -> ChatPlan:
    """InvalidRequestError (a 400) for what cannot be served as asked."""
    body.check_tools()
    source = getattr(tokenizer, "chat_template", None)
    tools = _tool_format(body, parsers, source)
    messages = [m.as_template_input() for m in body.messages]
    template_tools = body.template_tools()
    if tools is not None and tools.name == "phi4_mini" and source and "message['tools']" in source:
        messages = _tools_in_system_message(messages, template_tools)   # Phi-4-mini's own template reads them there
    try:
        text = tokenizer.render_chat(messages, tools=template_tools, variables=body.chat_template_kwargs)
    except ChatTemplateError as e:
        raise InvalidRequestError(f"cannot apply the chat template: {e}", "messages") from e
    reasoning = parsers.reasoning(source)
    reasoning = reasoning.for_prompt(text) if reasoning is not None else None
    constraint = _constraint(body, tools, reasoning)
    return ChatPlan(tokenizer.encode_chat(text), constraint, reasoning, tools)


def _tool_format(body: ChatCompletionRequest, parsers: ChatParsers, source: str | None) -> ToolCallFormat | None:
    if not body.uses_tools:
        return None
    tools = parsers.tool_format(source)
    if tools is None:
        raise InvalidRequestError("this model's chat template has no tool support (start the server with "
                                  "--tool-call-parser to name the format its model writes calls in)", "tools")
    return tools


def _constraint(body: ChatCompletionRequest, tools: ToolCallFormat | None,
                reasoning: ReasoningParser | None) -> Constraint | None:
    """The tool_choice's grammar or the response format's (not both), after the reasoning where there is one."""
    constraint = body.constraint()
    if tools is not None:
        try:
            tag = tools.structural_tag(body.template_tools(), body.effective_tool_choice, body.parallel_tool_calls)
        except ValueError as e:
            raise InvalidRequestError(str(e), "tool_choice") from e
        if tag is not None and constraint is not None:
            raise InvalidRequestError("an output constraint cannot be combined with tools (the reply is held to "
                                      "the tool calls' grammar); send tool_choice \"none\" to use it",
                                      constraint.param)
        constraint = Constraint.structural_tag(tag, "tools") if tag is not None else constraint
    if constraint is not None and reasoning is not None:
        return Constraint.structural_tag(reasoning.after_reasoning(constraint.tag_format()), constraint.param)
    return constraint


def _tools_in_system_message(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict]:
    listed = json.dumps([t["function"] for t in tools or []])
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "tools": listed}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": listed}, *messages]
