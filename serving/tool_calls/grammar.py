"""xgrammar structural tags (the JSON `GrammarCompiler.compile_structural_tag` reads) that hold a reply to
a request's `tool_choice`:

- "auto": free text; once the model writes a call marker, the call must name a declared function and
  its arguments must match that function's `parameters` schema (xgrammar's triggered tags);
- "required": the reply is one or more such calls;
- a named function: that function only, once (or several times with `parallel_tool_calls`);
- "none": no constraint (None).

`parallel_tool_calls=False` allows one call at most. xgrammar's own tags are used where they write the
format exactly (Qwen 3's for Hermes blocks, Llama's for Llama 3 JSON); the rest are built here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Literal

# what a function's name may be to sit inside a tag's literal text (OpenAI's names, and dotted ones)
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# a call's arguments with no `parameters` declared: any object
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# whitespace runs inside arguments: ", " and ": " fit; longer runs are where small models loop until max_tokens
MAX_WHITESPACE = 2


@dataclass(frozen=True)
class Function:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class Choice:
    mode: Literal["auto", "required", "named"]
    functions: tuple[Function, ...]     # the functions a call may name
    parallel: bool


def choice_of(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
              parallel_tool_calls: bool) -> Choice | None:
    """The request's tools and tool_choice (OpenAI's shapes); None where nothing is constrained. A
    ValueError says what is wrong with them."""
    functions = tuple(_function(tool) for tool in tools or [])
    if tool_choice is None or tool_choice == "auto":
        return Choice("auto", functions, parallel_tool_calls) if functions else None
    if tool_choice == "none":
        return None
    if tool_choice == "required":
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        return Choice("required", functions, parallel_tool_calls)
    name = _named(tool_choice)
    chosen = tuple(f for f in functions if f.name == name)
    if not chosen:
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the tools")
    return Choice("named", chosen[:1], parallel_tool_calls)


def _function(tool: Any) -> Function:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError('each tool must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    name, parameters = function["name"], function.get("parameters")
    if not _NAME.fullmatch(name):
        raise ValueError(f"function name {name!r}: names are 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.'")
    if parameters is not None and not isinstance(parameters, dict):
        raise ValueError(f"function {name!r}: parameters must be a JSON schema object")
    return Function(name, parameters or _ANY_OBJECT)


def _named(tool_choice: Any) -> str:
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
            and isinstance(function, dict) and isinstance(function.get("name"), str)):
        raise ValueError('tool_choice must be "none", "auto", "required" or '
                         '{"type": "function", "function": {"name": ...}}')
    return function["name"]


# ---- building blocks (xgrammar's format JSON)

def structural_tag(fmt: dict[str, Any]) -> dict[str, Any]:
    return {"type": "structural_tag", "format": fmt}


def call_tag(begin: str, function: Function, end: str) -> dict[str, Any]:
    """`begin`, the arguments as the function's schema has them, `end`."""
    return {"type": "tag", "begin": begin, "content": {"type": "json_schema", "json_schema": function.parameters,
                                                       "max_whitespace_cnt": MAX_WHITESPACE}, "end": end}


def separated(tags: list[dict[str, Any]], separator: str, parallel: bool) -> dict[str, Any]:
    """One or (with `parallel`) more of `tags`, `separator` between them, nothing else."""
    if not parallel and len(tags) == 1:
        return tags[0]
    return {"type": "tags_with_separator", "tags": tags, "separator": separator,
            "at_least_one": True, "stop_after_first": not parallel}


def calls_anywhere(choice: Choice, trigger: str, tag_of: Callable[[Function], dict[str, Any]],
                   separator: str) -> dict[str, Any]:
    """Calls that each begin with `trigger` (Hermes blocks, Llama objects, Mistral's `[TOOL_CALLS]name`):
    among free text for "auto"; for "required" and a named function, calls back to back and nothing else
    (OpenAI's "required" reply carries calls only)."""
    tags = [tag_of(f) for f in choice.functions]
    if choice.mode != "auto":
        return structural_tag(separated(tags, separator, choice.parallel))
    return structural_tag({"type": "triggered_tags", "triggers": [trigger], "tags": tags,
                           "at_least_one": choice.mode == "required",
                           "stop_after_first": not choice.parallel})


def calls_in_block(choice: Choice, trigger: str, opener: str, closer: str,
                   tag_of: Callable[[Function], dict[str, Any]], separator: str) -> dict[str, Any]:
    """Calls listed in one block `opener` ... `closer` (Mistral's `[TOOL_CALLS][...]`, Phi-4-mini's
    `<|tool_call|>[...]<|/tool_call|>`): for "auto" the block once the model writes `trigger` (the
    start of `opener`) after free text, the block alone otherwise."""
    inner = separated([tag_of(f) for f in choice.functions], separator, choice.parallel)
    block = {"type": "tag", "begin": opener, "content": inner, "end": closer}
    if choice.mode != "auto":
        return structural_tag(block)
    return structural_tag({"type": "triggered_tags", "triggers": [trigger], "tags": [block],
                           "stop_after_first": True})


def builtin(model: str, choice: Choice) -> dict[str, Any]:
    """xgrammar's own tag for `model` (its reasoning part left out: see ReasoningParser.after_reasoning)."""
    import xgrammar as xgr  # here: the parsers run without it

    tools = [{"type": "function", "function": {"name": f.name, "parameters": f.parameters}}
             for f in choice.functions]
    tool_choice: str | dict[str, Any] = (
        {"type": "function", "function": {"name": choice.functions[0].name}} if choice.mode == "named"
        else choice.mode)
    tag = xgr.get_model_structural_tag(model, tools=tools, tool_choice=tool_choice, reasoning="disabled",
                                       parallel_tool_calls=choice.parallel, max_whitespace_cnt=MAX_WHITESPACE)
    return tag.model_dump(mode="json")
