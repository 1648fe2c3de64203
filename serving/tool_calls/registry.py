"""Choosing a tool-call format: by name (a setting) or from the model's chat template, which writes a
conversation's calls in the format the model was trained to emit."""

from __future__ import annotations

from serving.tool_calls.format import ToolCallFormat
from serving.tool_calls.hermes import HermesFormat
from serving.tool_calls.llama3_json import Llama3JsonFormat
from serving.tool_calls.mistral import MistralFormat
from serving.tool_calls.phi4_mini import Phi4MiniFormat

FORMAT_NAMES: tuple[str, ...] = ("hermes", "llama3_json", "mistral", "phi4_mini")

_FORMATS = {"hermes": HermesFormat, "llama3_json": Llama3JsonFormat, "mistral": MistralFormat,
            "phi4_mini": Phi4MiniFormat}


def format_named(name: str) -> ToolCallFormat:
    if name not in _FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}: the formats are {', '.join(FORMAT_NAMES)}")
    return _FORMATS[name]()


def format_for_template(template_source: str | None) -> ToolCallFormat | None:
    """The format a chat template writes calls in; None where it has no tool support (or one of a
    format not served here). The markers are checked in this order because Hermes templates for other
    families (Hermes 3 on Llama 3.1) carry the family's own tokens too."""
    source = template_source or ""
    if "<tool_call>" in source:
        return HermesFormat()
    if "[TOOL_CALLS]" in source:
        return MistralFormat("name_args" if "[ARGS]" in source else "array")
    if "<|tool_call|>" in source or "<|tool|>" in source:
        # Phi-4-mini's own template only passes tools in (a system message's "tools"); llama.cpp's
        # writes calls too
        return Phi4MiniFormat()
    if "<|start_header_id|>" in source and ("<|python_tag|>" in source or '"parameters"' in source):
        return Llama3JsonFormat()
    return None
