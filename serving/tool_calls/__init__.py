"""The tool-call layer of the chat API: parsing a reply's calls (whole or streamed) in the format the
model writes them, and the xgrammar structural tags that constrain generation to a request's
tool_choice. Reasoning (`<think>`) is split off first by serving/reasoning_parser.py; reply.py
chains the two."""

from serving.tool_calls.call import CallId, ParsedReply, StreamDelta, ToolCall
from serving.tool_calls.format import ToolCallFormat
from serving.tool_calls.registry import FORMAT_NAMES, format_for_template, format_named
from serving.tool_calls.streaming import ToolCallStreamer

__all__ = ["CallId", "FORMAT_NAMES", "ParsedReply", "StreamDelta", "ToolCall", "ToolCallFormat",
           "ToolCallStreamer", "format_for_template", "format_named"]
