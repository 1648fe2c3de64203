"""The chat request's tool fields as OpenAI's Chat Completions names them: `tools`, `tool_choice`,
`parallel_tool_calls`, and the history's assistant `tool_calls` and tool results (`tool_call_id`)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError

MAX_TOOLS = 128


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    name: str
    arguments: str


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    def as_template_input(self) -> dict[str, Any]:
        """As vLLM gives templates: arguments as an object where they parse (the families' templates
        write them with `tojson`), else the string as sent."""
        try:
            arguments: Any = json.loads(self.function.arguments)
        except json.JSONDecodeError:
            arguments = self.function.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": arguments}}


class ToolFields(BaseModel):
    """Mixed into the chat request model."""

    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def uses_tools(self) -> bool:
        """Whether the reply may carry calls: tools were sent and tool_choice is not "none"."""
        return bool(self.tools) and self.effective_tool_choice != "none"

    @property
    def effective_tool_choice(self) -> str | dict[str, Any]:
        choice = self.tool_choice if self.tool_choice is not None else ("auto" if self.tools else "none")
        return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.uses_tools else None

    def check_tools(self) -> None:
        """400s for a tool_choice that names no declared tool, or asks for calls with no tools."""
        choice = self.tool_choice
        names = {t.function.name for t in self.tools or ()}
        if len(names) < len(self.tools or ()):
            raise InvalidRequestError("tools declares a function name twice", "tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise InvalidRequestError(f"tool_choice names the function {choice.function.name!r}, which is not "
                                      "among tools", "tool_choice")
        if choice is not None and choice != "none" and not self.tools:
            raise InvalidRequestError("tool_choice asks for tool calls but no tools were given", "tool_choice")
