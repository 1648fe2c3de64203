"""Reasoning split off a reply (serving/reasoning_parser.py): Qwen 3's think blocks, a block the prompt
opened, thinking turned off; streamed as it parses whole; calls inside the reasoning are not calls; the
grammar that leaves the reasoning free, checked with a real xgrammar matcher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.model.chat_template import ChatTemplate
from serving.reasoning_parser import ReasoningParser, reasoning_for_template
from serving.tool_calls import format_named
from serving.tool_calls.reply import ReplyStreamer, parse_reply

TEMPLATE_DIR = Path(__file__).parent / "data" / "chat_templates"
QWEN3 = (TEMPLATE_DIR / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
DEEPSEEK_R1 = (TEMPLATE_DIR / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(encoding="utf-8")
QWEN25 = (TEMPLATE_DIR / "Qwen-Qwen2.5-Coder-0.5B-Instruct.jinja").read_text(encoding="utf-8")
USER = [{"role": "user", "content": "What is 2 + 2?"}]
TAGGED, OPENED = ReasoningParser(), ReasoningParser(opened=True)


def call_ids(index: int) -> str:
    return f"call_{index}"


def _stream(parser: ReasoningParser, chunks: list[str]) -> tuple[str | None, str]:
    streamer = parser.streamer()
    parts = [streamer.feed(chunk) for chunk in chunks] + [streamer.finish()]
    return "".join(r for r, _ in parts) or None, "".join(c for _, c in parts)


@pytest.mark.parametrize("parser,text,expected", [
    (TAGGED, "<think>\nLet me add.\n2 + 2 = 4\n</think>\n\nIt is 4.", ("Let me add.\n2 + 2 = 4", "It is 4.")),
    (TAGGED, "  <think>short</think>It is 4.", ("short", "It is 4.")),
    (TAGGED, "It is 4.", (None, "It is 4.")),                       # no block: all content
    (TAGGED, "<think>\n\n</think>\n\nIt is 4.", (None, "It is 4.")),  # an empty block
    (TAGGED, "<think>\nstill thinking when the reply was cut", ("still thinking when the reply was cut", "")),
    (TAGGED, "It is 4. </think> is a tag", (None, "It is 4. </think> is a tag")),
    (TAGGED, "<thinking>is not the tag</thinking>", (None, "<thinking>is not the tag</thinking>")),
    (OPENED, "Let me add.\n</think>\n\nIt is 4.", ("Let me add.", "It is 4.")),
    (OPENED, "cut while thinking", ("cut while thinking", "")),
    (OPENED, "a</think>b</think>c", ("a", "b</think>c")),
])
def test_split(parser: ReasoningParser, text: str, expected: tuple[str | None, str]) -> None:
    assert parser.split(text) == expected
    assert _stream(parser, list(text)) == expected


def test_reasoning_is_sent_as_it_comes_and_a_partial_end_tag_is_held() -> None:
    streamer = TAGGED.streamer()
    assert streamer.feed("<thi") == ("", "")
    assert streamer.feed("nk>\nStep one") == ("Step one", "")
    assert streamer.feed(".\n</thi") == (".", "")
    assert streamer.feed("nk>\n\nIt is") == ("", "It is")
    assert streamer.feed(" 4.") == ("", " 4.")
    assert streamer.finish() == ("", "")


_PIECES = st.lists(st.one_of(st.sampled_from(["<think>", "</think>", "<th", "</", "think>", "\n", "  ", "<"]),
                             st.text(alphabet="ab <>/\n", max_size=6)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(pieces=_PIECES, opened=st.booleans())
def test_a_streamed_reply_splits_as_the_whole_one_wherever_it_is_cut(pieces: list[str], opened: bool) -> None:
    parser = ReasoningParser(opened=opened)
    text = "".join(pieces)
    whole = parser.split(text)
    for at in range(len(text) + 1):
        assert _stream(parser, [text[:at], text[at:]]) == whole
    assert _stream(parser, list(text)) == whole


def test_the_template_says_whether_the_model_reasons_and_whether_the_prompt_opens_the_block() -> None:
    assert reasoning_for_template(QWEN3) == TAGGED
    assert reasoning_for_template(DEEPSEEK_R1) == OPENED
    assert reasoning_for_template(QWEN25) is None
    assert reasoning_for_template(None) is None


def test_the_bundled_models_template_does_not_reason() -> None:
    from engine.model.checkpoint import bundled_model_path, read_gguf_metadata

    assert reasoning_for_template(read_gguf_metadata(bundled_model_path())["tokenizer.chat_template"]) is None


def test_each_prompt_decides_the_case() -> None:
    qwen3 = ChatTemplate(QWEN3, "qwen3")
    parser = reasoning_for_template(QWEN3)
    assert parser is not None
    assert parser.for_prompt(qwen3.render(USER)) == TAGGED
    # enable_thinking false: the template writes an empty block into the prompt, the reply has none
    assert parser.for_prompt(qwen3.render(USER, variables={"enable_thinking": False})) is None
    deepseek = ChatTemplate(DEEPSEEK_R1, "deepseek-r1")
    assert parser.for_prompt(deepseek.render(USER)) == OPENED


HERMES = format_named("hermes")
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'
DRAFT = '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>'


def test_a_call_drafted_in_the_reasoning_is_not_a_call() -> None:
    text = f"<think>\nI could write {DRAFT} but no.\n</think>\n\n{CALL}"
    reasoning, reply = parse_reply(text, TAGGED, HERMES, call_ids)
    assert reasoning == f"I could write {DRAFT} but no."
    assert reply.content is None and reply.malformed == 0
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("add", '{"a": 2, "b": 2}')]


@settings(max_examples=40, deadline=None)
@given(reasoning=st.sampled_from(["", "hmm", DRAFT, "<tool_ca"]), content=st.sampled_from(["", "Sure. ", "<tool"]),
       calls=st.integers(0, 2), opened=st.booleans(), data=st.data())
def test_a_streamed_reply_with_reasoning_and_calls_comes_out_as_the_whole_one(
        reasoning: str, content: str, calls: int, opened: bool, data: st.DataObject) -> None:
    parser = ReasoningParser(opened=opened)
    text = ("" if opened else "<think>") + reasoning + "</think>\n\n" + content + "\n".join([CALL] * calls)
    whole_reasoning, whole = parse_reply(text, parser, HERMES, call_ids)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    streamer = ReplyStreamer(parser, HERMES, call_ids)
    deltas = [streamer.feed(chunk) for chunk in chunks] + [streamer.finish()]
    assert ("".join(d.reasoning for d in deltas) or None) == whole_reasoning
    assert ("".join(d.content for d in deltas) or None) == whole.content
    arguments = [t["function"]["arguments"] for d in deltas for t in d.tool_calls if "id" not in t]
    assert arguments == [c.arguments for c in whole.tool_calls] and len(whole.tool_calls) == calls


def test_without_a_tool_format_the_content_passes_through() -> None:
    reasoning, reply = parse_reply("<think>x</think>\n\nPlain answer.\n", TAGGED, None, call_ids)
    assert reasoning == "x" and reply.content == "Plain answer.\n" and reply.tool_calls == ()


# ---- the grammar after the reasoning

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def compiler() -> Any:
    import xgrammar as xgr
    from engine.model.checkpoint import bundled_model_path
    from engine.model.tokenizer import load_tokenizer

    tok = load_tokenizer("gguf", bundled_model_path(), 49152)._tok
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=49152))


def _accepts(compiler: Any, tag: dict[str, Any], text: str) -> bool:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiler.compile_structural_tag(json.dumps(tag)))
    return matcher.accept_string(text) and matcher.is_completed()


def test_tool_calls_are_held_only_after_the_reasoning(compiler: Any) -> None:
    required = HERMES.structural_tag(TOOLS, "required", True)
    assert required is not None
    tag = TAGGED.after_reasoning(required)
    assert tag["format"]["elements"][0]["begin"] == "<think>"
    assert _accepts(compiler, tag, f"<think>\nMaybe {DRAFT}, or just add.\n</think>\n\n{CALL}")
    assert not _accepts(compiler, tag, f"<think>\nJust add.\n</think>\n\n{DRAFT}")
    assert not _accepts(compiler, tag, "<think>\nJust add.\n</think>\n\nThe answer is 4.")
    assert not _accepts(compiler, tag, CALL)                     # the block comes first
    opened = OPENED.after_reasoning(required)
    assert _accepts(compiler, opened, f"Just add.\n</think>\n\n{CALL}")
    assert not _accepts(compiler, opened, f"<think>x</think>{CALL}<think>")


def test_a_json_schema_is_held_only_after_the_reasoning(compiler: Any) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    tag = TAGGED.after_reasoning({"type": "json_schema", "json_schema": schema})
    assert _accepts(compiler, tag, '<think>2 + 2 is {four}</think>\n{"answer": 4}')
    assert not _accepts(compiler, tag, '<think>2 + 2</think>\n{"answer": "four"}')
    assert not _accepts(compiler, tag, '<think>2 + 2</think>\nIt is 4.')
