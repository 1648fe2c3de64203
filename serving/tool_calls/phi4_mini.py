"""Phi-4-mini's calls: a JSON list of call objects between `<|tool_call|>` and `<|/tool_call|>`:

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>

The model often leaves the block open (its end is the end of turn), and sometimes writes one object, or
several separated by commas, without the list (BFCL's Phi handler documents both); all are read.
llama.cpp's tool-aware Phi-4-mini template writes one object per block. `<|tool_call|>` and
`<|/tool_call|>` are special tokens of Phi-4-mini's tokenizer: the text parsed must be detokenized with
them kept."""

from __future__ import annotations

from typing import Any

from serving.tool_calls import grammar
from serving.tool_calls.format import MarkerFormat, block_region
from serving.tool_calls.json_object import CallSpec
from serving.tool_calls.scanner import Region

OPEN, CLOSE = "<|tool_call|>", "<|/tool_call|>"
_CALL = CallSpec(args_keys=("arguments", "parameters"))


class Phi4MiniFormat(MarkerFormat):
    name = "phi4_mini"
    markers = (OPEN,)

    def read_region(self, text: str, start: int, final: bool) -> Region | None:
        return block_region(text, start, OPEN, CLOSE, final, _CALL, several=True)

    def grammar_for(self, choice: grammar.Choice) -> dict[str, Any]:
        return grammar.calls_in_block(choice, OPEN, OPEN + "[", "]" + CLOSE, _object_tag, ", ")


def _object_tag(function: grammar.Function) -> dict[str, Any]:
    return grammar.call_tag(f'{{"name": "{function.name}", "arguments": ', function, "}")
