"""Tool-call formats (serving/tool_calls/): whole replies, streamed replies split anywhere, replies the
families' own chat templates write, malformed calls, choosing a format, and the xgrammar structural
tags checked with a real matcher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.model.chat_template import END_OF_TURN_TOKENS, ChatTemplate, ChatTemplateError, SpecialTokens
from serving.reasoning_parser import reasoning_for_template
from serving.tool_calls import FORMAT_NAMES, ParsedReply, ToolCall, format_for_template, format_named
from serving.tool_calls.format import ToolCallFormat
from serving.tool_calls.grammar import choice_of
from serving.tool_calls.mistral import MistralFormat
from serving.tool_calls.reply import parse_reply

TEMPLATE_DIR = Path(__file__).parent / "data" / "chat_templates"
TEMPLATES = sorted(p.name for p in TEMPLATE_DIR.glob("*.jinja"))


def template_source(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text(encoding="utf-8")


def call_ids(index: int) -> str:
    return f"call_{index}"


def assemble(deltas: list[dict[str, Any]]) -> tuple[ToolCall, ...]:
    """The calls of streamed tool-call deltas, as an OpenAI client puts them together."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        index = delta["index"]
        if "id" in delta:           # a call's first delta: its id, type and name
            assert index == len(calls) and delta["type"] == "function"
            calls[index] = {"id": delta["id"], "name": delta["function"]["name"], "arguments": ""}
        calls[index]["arguments"] += delta["function"].get("arguments", "")
    return tuple(ToolCall(i, c["id"], c["name"], c["arguments"]) for i, c in sorted(calls.items()))


def stream(fmt: ToolCallFormat, chunks: list[str]) -> ParsedReply:
    """A reply fed to the format's streamer in `chunks`, put together again."""
    streamer = fmt.streamer(call_ids)
    deltas = [streamer.feed(chunk) for chunk in chunks] + [streamer.finish()]
    content = "".join(d.content for d in deltas)
    return ParsedReply(content or None, assemble([t for d in deltas for t in d.tool_calls]), streamer.malformed)

FORMATS: dict[str, ToolCallFormat] = {"hermes": format_named("hermes"), "llama3_json": format_named("llama3_json"),
                                      "mistral": MistralFormat("array"), "mistral_name_args": MistralFormat("name_args"),
                                      "phi4_mini": format_named("phi4_mini")}


def _obj(name: str, args: str, key: str = "arguments", sep: str = ", ") -> str:
    return f'{{"name": {json.dumps(name)}{sep}"{key}": {args}}}'


# one group of calls (name, arguments text) as each format writes it; `variant` picks among the ways the
# format is seen written (whitespace, optional parts, open last block)
def _hermes(calls: list[tuple[str, str]], variant: int) -> str:
    inner = "\n" if variant % 2 == 0 else ""
    return "\n".join(f"<tool_call>{inner}{_obj(n, a)}{inner}</tool_call>" for n, a in calls)


def _llama(calls: list[tuple[str, str]], variant: int) -> str:
    key = "parameters" if variant % 3 else "arguments"
    text = "; ".join(_obj(n, a, key) for n, a in calls)
    return ("<|python_tag|>" if variant % 2 else "") + text


def _mistral(calls: list[tuple[str, str]], variant: int) -> str:
    objs = [_obj(n, a)[:-1] + (f', "id": "abcdefgh{i}"}}' if variant % 2 else "}") for i, (n, a) in enumerate(calls)]
    return "[TOOL_CALLS][" + ", ".join(objs) + "]"


def _mistral_name_args(calls: list[tuple[str, str]], variant: int) -> str:
    call_id = "[CALL_ID]a1b2c3d4e" if variant % 2 else ""
    return "".join(f"[TOOL_CALLS]{n}{call_id}[ARGS]{a}" for n, a in calls)


def _phi(calls: list[tuple[str, str]], variant: int) -> str:
    if variant % 3 == 2:
        return "".join(f"<|tool_call|>{_obj(n, a)}<|/tool_call|>" for n, a in calls)
    return "<|tool_call|>[" + ", ".join(_obj(n, a) for n, a in calls) + "]<|/tool_call|>"


RENDER: dict[str, Callable[[list[tuple[str, str]], int], str]] = {
    "hermes": _hermes, "llama3_json": _llama, "mistral": _mistral, "mistral_name_args": _mistral_name_args,
    "phi4_mini": _phi}

CALLS = [("get_weather", '{"city": "Paris", "unit": "celsius"}'), ("add", '{"a":1,"b":[2, {"c": "}]"}]}')]


def _expect(reply: ParsedReply, content: str | None, calls: list[tuple[str, str]], malformed: int = 0) -> None:
    assert reply.content == content
    assert [(c.index, c.id, c.name, c.arguments) for c in reply.tool_calls] == \
           [(i, call_ids(i), n, a) for i, (n, a) in enumerate(calls)]
    assert reply.malformed == malformed


# ---- whole replies

@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("variant", range(3))
def test_calls_after_text_are_parsed_with_their_arguments_as_written(name: str, variant: int) -> None:
    text = "Let me look that up.\n\n" + RENDER[name](CALLS, variant)
    _expect(FORMATS[name].parse(text, call_ids), "Let me look that up.", CALLS)


@pytest.mark.parametrize("name", FORMATS)
def test_a_reply_without_calls_is_its_text(name: str) -> None:
    text = "Paris is the capital of France. Braces {like these} and [brackets] and <tags> are text."
    _expect(FORMATS[name].parse(text, call_ids), text, [])
    _expect(FORMATS[name].parse("", call_ids), None, [])


@pytest.mark.parametrize("text, content, calls", [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [("get_weather", '{"city": "Paris"}')]),
    ('  {"name": "f", "arguments": {}}\n', None, [("f", "{}")]),
    ('Call it: {"name": "f", "arguments": {}}', 'Call it: {"name": "f", "arguments": {}}', []),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),
    ('{"name": "f", "arguments": {', '{"name": "f", "arguments": {', []),
    ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', None, [("f", '{"a": 1}')]),
    ('```\n{"name": "f", "arguments": {}}\n```\nDone.', "Done.", [("f", "{}")]),
    ('```python\nprint(1)\n```', '```python\nprint(1)\n```', []),
    ('Here:\n```json\n{"name": "f", "arguments": {}}\n```', 'Here:\n```json\n{"name": "f", "arguments": {}}\n```', []),
])
def test_hermes_reads_a_bare_call_object_that_opens_the_reply(text: str, content: str | None,
                                                               calls: list[tuple[str, str]]) -> None:
    """Qwen2.5-Coder's small models write the call without its block: at the start of a reply it is the call;
    after prose, or not a call object, it is text (and no malformed call)."""
    _expect(format_named("hermes").parse(text, call_ids), content, calls)
    streamer, assembled = format_named("hermes").streamer(call_ids), []
    for i in range(0, len(text), 3):
        assembled.append(streamer.feed(text[i:i + 3]))
    assembled.append(streamer.finish())
    assert "".join(d.content for d in assembled) == (content or "")
    assert len([c for d in assembled for c in d.tool_calls if "id" in c]) == len(calls)


def test_hermes_blocks_apart_with_text_between_keep_the_text() -> None:
    text = _hermes(CALLS[:1], 0) + "\nand then\n" + _hermes(CALLS[1:], 0) + "\n"
    _expect(format_named("hermes").parse(text, call_ids), "and then", CALLS)


def test_the_last_block_left_open_is_a_call() -> None:
    # the end of turn ends it: Qwen and Phi-4-mini are seen stopping without the closing marker
    hermes = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    _expect(format_named("hermes").parse(hermes, call_ids), None, [("get_weather", '{"city": "Paris"}')])
    phi = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    _expect(format_named("phi4_mini").parse(phi, call_ids), None, [("get_weather", '{"city": "Paris"}')])


def test_phi4_mini_objects_without_the_list() -> None:
    text = '<|tool_call|>{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}<|/tool_call|>'
    _expect(format_named("phi4_mini").parse(text, call_ids), None, [("a", "{}"), ("b", '{"x": 1}')])


def test_llama_separators_between_calls_are_not_content() -> None:
    text = '{"name": "a", "parameters": {}} ;\n{"name": "b", "parameters": {}};'
    _expect(format_named("llama3_json").parse(text, call_ids), None, [("a", "{}"), ("b", "{}")])


def test_quoted_arguments_are_the_json_they_quote() -> None:
    # what a model copies from a history whose string arguments a template quoted (tojson of a string)
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    _expect(format_named("hermes").parse(text, call_ids), None, [("f", '{"a": 1}')])


# ---- malformed calls: no exception, counted, their text stays content

MALFORMED = {
    "hermes": ['<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>',            # unbalanced
               '<tool_call>\n{"name": "f", "arguments": {}, "extra": 1}\n</tool_call>',     # unknown key
               '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',                        # no name
               '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',                  # empty name
               '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',                # not an object
               '<tool_call>\n{"name": "f"}\n</tool_call>',                                  # no arguments
               '<tool_call>\nnot json at all\n</tool_call>',
               '<tool_call>\n{"name": "f", "arguments": {"a": 1}} trailing\n</tool_call>',
               '<tool_call>\n{"name": "f", "arguments": {"a": 1'],                         # truncated
    "llama3_json": ['{"name": "f", "parameters": {"a": 1}, "extra": true}',
                    '{"name": "Bob", "age": 3}',
                    '{"name": "f", "arguments": {}, "parameters": {}}',
                    '<|python_tag|>print("hi")',
                    '{"name": "f", "parameters": {"a": tru'],
    "mistral": ['[TOOL_CALLS][{"name": "f", "arguments": {}, "extra": 1}]',
                '[TOOL_CALLS][{"arguments": {}}]',
                '[TOOL_CALLS][]',
                '[TOOL_CALLS] just words',
                '[TOOL_CALLS][{"name": "f", "arguments": {"a": '],
    "mistral_name_args": ['[TOOL_CALLS]f[ARGS][1, 2]',
                          '[TOOL_CALLS]f and more',
                          '[TOOL_CALLS]f[ARGS]{"a": '],
    "phi4_mini": ['<|tool_call|>[{"name": "f", "arguments": {}, "type": "dict", "description": "x"}]<|/tool_call|>',
                  '<|tool_call|>[{"arguments": {}}]<|/tool_call|>',
                  '<|tool_call|>[]<|/tool_call|>',
                  '<|tool_call|>[{"name": "f", "arguments": {"a": 1}]<|/tool_call|>',
                  '<|tool_call|>[{"name": "f", "arguments": {"a": 1}}] then words'],
}


@pytest.mark.parametrize("name,text", [(n, t) for n, texts in MALFORMED.items() for t in texts])
def test_a_malformed_call_is_counted_and_stays_content(name: str, text: str) -> None:
    fmt = FORMATS[name]
    around = f"Before. {text}\nAfter."
    reply = fmt.parse(around, call_ids)
    assert reply.tool_calls == () and reply.malformed == 1
    assert reply.content == around
    assert stream(fmt, list(around)) == reply


@pytest.mark.parametrize("name", FORMATS)
def test_a_malformed_call_does_not_hide_the_good_ones_around_it(name: str) -> None:
    bad = MALFORMED[name][0]
    good = RENDER[name](CALLS[:1], 0)
    reply = FORMATS[name].parse(good + "\n" + bad + "\n" + good, call_ids)
    assert [c.name for c in reply.tool_calls] == ["get_weather", "get_weather"]
    assert reply.malformed == 1 and reply.content == bad


# ---- streaming

def test_content_is_sent_at_once_and_a_partial_marker_is_held_back() -> None:
    streamer = format_named("hermes").streamer(call_ids)
    assert streamer.feed("Hello wor").content == "Hello wor"
    assert streamer.feed("ld <tool_ca").content == "ld"          # " <tool_ca" may open a call
    assert streamer.feed("t> is a tag").content == " <tool_cat> is a tag"
    delta = streamer.feed(' <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_')
    assert delta.content == "" and delta.tool_calls == []        # the call is not whole yet
    delta = streamer.feed("call>")
    assert delta.tool_calls == [{"index": 0, "id": "call_0", "type": "function",
                                 "function": {"name": "f", "arguments": ""}},
                                {"index": 0, "function": {"arguments": '{"a": 1}'}}]
    assert streamer.finish().content == "" and streamer.malformed == 0


def test_a_brace_is_held_only_until_it_cannot_open_a_llama_call() -> None:
    streamer = format_named("llama3_json").streamer(call_ids)
    assert streamer.feed("x = {").content == "x ="
    assert streamer.feed(' "na').content == ""
    assert streamer.feed("p").content == ' { "nap'


def _noise() -> st.SearchStrategy[str]:
    fragments = ["<", "<tool", "<tool_call", "</tool_call>", "{", "}", '{"name"', '{"name": ', "[", "]",
                 "[TOOL", "[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", "<|/tool_call|>", "<|python_tag|>",
                 "<|", ";", ", ", '"', "\n", "  "]
    return st.one_of(st.sampled_from(fragments), st.text(alphabet='ab {}[]<>|/;:",_\n', max_size=8))


_CLEAN = st.text(alphabet="abcXYZ .,!?'-\n", max_size=16)
_NAMES = st.sampled_from(["get_weather", "add", "search.web", "f"])
_ARGS = st.dictionaries(st.sampled_from(["a", "city", "q"]),
                        st.one_of(st.integers(-5, 5), st.text(alphabet='ab}{][" \\<>', max_size=6),
                                  st.lists(st.integers(0, 3), max_size=3)), max_size=3)


@st.composite
def _calls(draw: st.DrawFn) -> list[tuple[str, str]]:
    args = draw(st.lists(_ARGS, min_size=1, max_size=3))
    separators = draw(st.sampled_from([(", ", ": "), (",", ":")]))
    return [(draw(_NAMES), json.dumps(a, separators=separators)) for a in args]


@st.composite
def clean_replies(draw: st.DrawFn, name: str) -> tuple[str, list[str], list[tuple[str, str]]]:
    """A reply of plain text and well-formed calls: (text, its text pieces, its calls)."""
    pieces: list[str] = []
    calls: list[tuple[str, str]] = []
    text = ""
    for kind in draw(st.lists(st.sampled_from(["text", "calls"]), max_size=5)):
        if kind == "text":
            piece = draw(_CLEAN)
            pieces.append(piece)
        else:
            group = draw(_calls())
            calls.extend(group)
            piece = RENDER[name](group, draw(st.integers(0, 5)))
            if text and not text[-1].isspace():
                piece = "\n" + piece
        text += piece
    return text, pieces, calls


@st.composite
def noisy_replies(draw: st.DrawFn, name: str) -> str:
    """Any mix of text, calls, marker fragments, truncated and broken calls."""
    parts: list[str] = []
    for kind in draw(st.lists(st.sampled_from(["clean", "noise", "call", "cut", "broken"]), max_size=6)):
        if kind == "clean":
            parts.append(draw(_CLEAN))
        elif kind == "noise":
            parts.append(draw(_noise()))
        else:
            call = RENDER[name](draw(_calls()), draw(st.integers(0, 5)))
            if kind == "cut":
                call = call[:draw(st.integers(0, len(call)))]
            elif kind == "broken":
                at = draw(st.integers(0, len(call)))
                call = call[:at] + draw(st.sampled_from(['"', "}", "]", ",", "x", "{", '"extra": 1, '])) + call[at:]
            parts.append(call)
    return "".join(parts)


def _check_split_everywhere(fmt: ToolCallFormat, text: str) -> ParsedReply:
    whole = fmt.parse(text, call_ids)
    for at in range(len(text) + 1):
        assert stream(fmt, [text[:at], text[at:]]) == whole, at
    assert stream(fmt, list(text)) == whole
    return whole


_PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", FORMATS)
@_PROPERTY
@given(data=st.data())
def test_clean_replies_parse_to_their_calls_streamed_or_whole(name: str, data: st.DataObject) -> None:
    text, pieces, calls = data.draw(clean_replies(name))
    whole = _check_split_everywhere(FORMATS[name], text)
    _expect(whole, whole.content, calls)
    assert "".join((whole.content or "").split()) == "".join("".join(pieces).split())


@pytest.mark.parametrize("name", FORMATS)
@_PROPERTY
@given(data=st.data())
def test_any_reply_streams_as_it_parses_whole_wherever_it_is_split(name: str, data: st.DataObject) -> None:
    text = data.draw(noisy_replies(name))
    _check_split_everywhere(FORMATS[name], text)
    chunks = data.draw(st.lists(st.integers(1, 7), max_size=40))
    pieces, at = [], 0
    for size in chunks:
        pieces.append(text[at:at + size])
        at += size
    pieces.append(text[at:])
    assert stream(FORMATS[name], pieces) == FORMATS[name].parse(text, call_ids)


# ---- the families' own chat templates

ARGS = {"city": "Paris", "unit": "celsius"}
TWO_CALLS = [("a1b2c3d4e", "get_weather", ARGS), ("f5g6h7i8j", "get_time", {"zone": "Europe/Paris"})]
USER = {"role": "user", "content": "What is the weather in Paris, and the time?"}
EOS = {"qwen": "<|im_end|>", "llama": "<|eot_id|>", "mistral": "</s>", "phi": "<|endoftext|>"}

# template -> (format, family, calls it can write, content of a calls-only message)
ROUND_TRIPS = {
    "Qwen-Qwen2.5-Coder-0.5B-Instruct.jinja": ("hermes", "qwen", 2, None),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", "qwen", 2, ""),              # `'</think>' in message.content`
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3_json", "llama", 1, None),   # one call per message
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("llama3_json", "llama", 1, None),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", "mistral", 2, None),
    "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", "mistral", 2, None),
    "llama-cpp-microsoft-Phi-4-mini-instruct.jinja": ("phi4_mini", "phi", 2, None),
}


def _assistant_part(template: ChatTemplate, assistant: dict[str, Any]) -> str:
    """What the template writes for the assistant's message: the conversation rendered with it, less the
    prompt for it, up to the end of the turn."""
    prompt = template.render([USER], add_generation_prompt=True)
    full = template.render([USER, assistant], add_generation_prompt=False)
    assert full.startswith(prompt)
    part = full[len(prompt):]
    ends = [part.find(t) for t in (*END_OF_TURN_TOKENS, template.special.eos_token or "") if t and t in part]
    return part[:min(ends)] if ends else part


def _assistant(calls: list[tuple[str, str, dict[str, Any]]], content: str | None, as_string: bool) -> dict[str, Any]:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": i, "type": "function",
                            "function": {"name": n, "arguments": json.dumps(a) if as_string else a}}
                           for i, n, a in calls]}


@pytest.mark.parametrize("fixture", ROUND_TRIPS)
@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_calls_a_template_writes_parse_back_to_the_same_calls(fixture: str, as_string: bool) -> None:
    name, family, count, content = ROUND_TRIPS[fixture]
    source = template_source(fixture)
    template = ChatTemplate(source, fixture, SpecialTokens(eos_token=EOS[family]))
    calls = TWO_CALLS[:count]
    part = _assistant_part(template, _assistant(calls, content, as_string))
    fmt = format_for_template(source)
    assert fmt is not None and fmt.name == name
    reasoning, reply = parse_reply(part, reasoning_for_template(source), fmt, call_ids)
    assert reasoning is None and reply.content is None and reply.malformed == 0
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [(n, a) for _, n, a in calls]
    # the history form the model was trained on: the arguments object itself; only Qwen 3's template
    # writes a string as it is, the others quote it as a JSON string
    written_as_object = json.dumps(ARGS) in part
    assert written_as_object == (not as_string or fixture == "Qwen-Qwen3-0.6B.jinja")


def test_mistral_templates_want_ids_of_nine_alphanumerics() -> None:
    template = ChatTemplate(template_source("mistralai-Mistral-Nemo-Instruct-2407.jinja"), "nemo")
    with pytest.raises(ChatTemplateError, match="length 9"):
        template.render([USER, _assistant([("call_0", "get_weather", ARGS)], None, False)], False)


def test_phi4_minis_own_template_takes_tools_in_the_system_message_and_calls_as_content() -> None:
    template = ChatTemplate(template_source("microsoft-Phi-4-mini-instruct.jinja"), "phi-4-mini",
                            SpecialTokens(eos_token=EOS["phi"]))
    tools = json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}])
    system = {"role": "system", "content": "You are a helpful assistant with some tools.", "tools": tools}
    assert f"<|tool|>{tools}<|/tool|>" in template.render([system, USER])
    with pytest.raises((ChatTemplateError, TypeError)):   # it writes no tool_calls: '...' + None fails
        template.render([USER, _assistant(TWO_CALLS, None, False)], False)
    text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]<|/tool_call|>'
    part = _assistant_part(template, {"role": "assistant", "content": text})
    reply = format_named("phi4_mini").parse(part, call_ids)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("get_weather", ARGS)]


@pytest.mark.parametrize("fixture,expected", [
    ("Qwen-Qwen2.5-Coder-0.5B-Instruct.jinja", "hermes"), ("Qwen-Qwen3-0.6B.jinja", "hermes"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3_json"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3_json"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral"),
    ("mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja", "mistral"),
    ("llama-cpp-microsoft-Phi-4-mini-instruct.jinja", "phi4_mini"),
    ("microsoft-Phi-4-mini-instruct.jinja", "phi4_mini"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", None),        # a format not served here
])
def test_the_format_is_read_from_the_template(fixture: str, expected: str | None) -> None:
    fmt = format_for_template(template_source(fixture))
    assert (fmt.name if fmt else None) == expected


def test_mistral_templates_give_the_form_they_write() -> None:
    nemo = format_for_template(template_source("mistralai-Mistral-Nemo-Instruct-2407.jinja"))
    small = format_for_template(template_source("mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja"))
    assert isinstance(nemo, MistralFormat) and nemo.call_form == "array"
    assert isinstance(small, MistralFormat) and small.call_form == "name_args"


def test_the_bundled_models_template_has_no_tool_support() -> None:
    from engine.model.checkpoint import bundled_model_path, read_gguf_metadata

    source = read_gguf_metadata(bundled_model_path())["tokenizer.chat_template"]
    assert format_for_template(source) is None
    assert format_for_template(None) is None


def test_every_template_fixture_is_covered() -> None:
    assert set(TEMPLATES) == {*ROUND_TRIPS, "microsoft-Phi-4-mini-instruct.jinja",
                              "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"}


def test_formats_by_name() -> None:
    assert FORMAT_NAMES == ("hermes", "llama3_json", "mistral", "phi4_mini")
    assert [format_named(n).name for n in FORMAT_NAMES] == list(FORMAT_NAMES)
    with pytest.raises(ValueError, match="hermes, llama3_json, mistral, phi4_mini"):
        format_named("pythonic")


# ---- structural tags

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                          "unit": {"enum": ["celsius", "fahrenheit"]}},
                         "required": ["city"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "required": ["a", "b"], "additionalProperties": False}}}]
WEATHER = ("get_weather", '{"city": "Paris", "unit": "celsius"}')
ADD = ("add", '{"a": 1, "b": 2}')
UNDECLARED = ("delete_files", '{"city": "Paris"}')
BAD_ARGS = [("add", '{"a": "one", "b": 2}'), ("add", '{"a": 1}'), ("get_weather", '{"city": "Paris", "unit": "kelvin"}')]


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


def _written(name: str, calls: list[tuple[str, str]]) -> str:
    """Calls as each format's grammar writes them."""
    if name == "hermes":
        return "\n".join(f'<tool_call>\n{_obj(n, a)}\n</tool_call>' for n, a in calls)
    if name == "llama3_json":
        return "; ".join(_obj(n, a, "parameters") for n, a in calls)
    return RENDER[name](calls, 0)


@pytest.mark.parametrize("name", FORMATS)
def test_auto_lets_text_through_and_holds_a_call_once_it_opens(compiler: Any, name: str) -> None:
    fmt = FORMATS[name]
    tag = fmt.structural_tag(TOOLS, "auto", True)
    assert tag is not None
    for good in ["The weather is fine.", "Let me check. " + _written(name, [WEATHER]),
                 _written(name, [WEATHER, ADD])]:
        assert _accepts(compiler, tag, good), good
    for bad in [UNDECLARED, *BAD_ARGS]:
        assert not _accepts(compiler, tag, "Let me check. " + _written(name, [bad])), bad


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("parallel", [True, False])
def test_required_means_calls_to_declared_functions_with_valid_arguments(compiler: Any, name: str,
                                                                         parallel: bool) -> None:
    fmt = FORMATS[name]
    tag = fmt.structural_tag(TOOLS, "required", parallel)
    assert not _accepts(compiler, tag, "The weather is fine.")
    for calls in ([WEATHER], [ADD]):
        text = _written(name, calls)
        assert _accepts(compiler, tag, text)
        assert [(c.name, c.arguments) for c in fmt.parse(text, call_ids).tool_calls] == calls
    assert _accepts(compiler, tag, _written(name, [WEATHER, ADD])) == parallel
    for bad in [UNDECLARED, *BAD_ARGS]:
        assert not _accepts(compiler, tag, _written(name, [bad])), bad


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("parallel", [True, False])
def test_a_named_function_is_the_only_one_called(compiler: Any, name: str, parallel: bool) -> None:
    tag = FORMATS[name].structural_tag(TOOLS, {"type": "function", "function": {"name": "add"}}, parallel)
    assert _accepts(compiler, tag, _written(name, [ADD]))
    assert _accepts(compiler, tag, _written(name, [ADD, ("add", '{"a": 3, "b": 4}')])) == parallel
    assert not _accepts(compiler, tag, _written(name, [WEATHER]))
    assert not _accepts(compiler, tag, "I would rather not.")


@pytest.mark.parametrize("name", FORMATS)
def test_no_constraint_without_tools_or_with_tool_choice_none(name: str) -> None:
    assert FORMATS[name].structural_tag(TOOLS, "none", True) is None
    assert FORMATS[name].structural_tag([], "auto", True) is None


@pytest.mark.parametrize("tools,tool_choice,message", [
    ([], "required", "at least one tool"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    (TOOLS, "sometimes", "tool_choice must be"),
    ([{"type": "function", "function": {"name": 'bad"name'}}], "auto", "names are"),
    ([{"type": "retrieval"}], "auto", "each tool must be"),
])
def test_a_choice_that_cannot_be_held_is_a_value_error(tools: list[dict[str, Any]], tool_choice: Any,
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        choice_of(tools, tool_choice, True)
