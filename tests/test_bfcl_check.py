"""benchmarks/bfcl_check.py's pure parts on hand-made replies: decoding into BFCL's format, the streamed
delta assembler, the irrelevance rule, the required-call check and the summary. The cases that need
bfcl-eval (its own checker and data) skip where it is not installed, as in the project's venv."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bfcl_replies as br  # noqa: E402

MESSAGE = {"finish_reason": "tool_calls", "index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
    {"type": "function", "id": "call_a", "function": {"name": "math_hypot", "arguments": '{"x": 4, "y": 5}'}},
    {"type": "function", "id": "call_b", "function": {"name": "math_factorial", "arguments": '{"number": 5}'}}]}}


def chunk(delta: dict, finish_reason: str | None = None) -> dict:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def call_delta(index: int, **fields: object) -> dict:
    function = {k: fields.pop(k) for k in ("name", "arguments") if k in fields}
    return {"tool_calls": [{"index": index, **fields, **({"function": function} if function else {})}]}


# the shape llama.cpp's server streams: id, type and name first with empty arguments, then fragments
STREAM = [chunk({"role": "assistant", "content": None}),
          chunk(call_delta(0, id="s_a", type="function", name="math_hypot", arguments="")),
          chunk(call_delta(0, arguments='{"x": ')), chunk(call_delta(0, arguments='4, "y": 5}')),
          chunk(call_delta(1, id="s_b", type="function", name="math_factorial", arguments='{"num')),
          chunk(call_delta(1, arguments='ber": 5}')), chunk({}, "tool_calls")]


def text_reply(content: str) -> br.Reply:
    return br.Reply(content=content, finish_reason="stop")


def call_reply(*calls: tuple[str, object]) -> br.Reply:
    return br.Reply(None, [br.ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(calls)], "tool_calls")


def test_a_message_decodes_into_bfcl_calls():
    reply = br.parse_message(MESSAGE)
    assert [c.id for c in reply.tool_calls] == ["call_a", "call_b"] and reply.finish_reason == "tool_calls"
    assert br.decode_calls(reply) == [{"math_hypot": {"x": 4, "y": 5}}, {"math_factorial": {"number": 5}}]


@pytest.mark.parametrize("reply", [text_reply("It is 120."), br.Reply(None), call_reply(("f", "{x: 1}")),
                                   call_reply(("f", {"x": 1}))], ids=["text", "empty", "not-json", "not-text"])
def test_what_bfcl_cannot_decode_is_a_decode_error(reply: br.Reply):
    with pytest.raises(br.DecodeError):
        br.decode_calls(reply)


def test_the_function_calling_format():
    assert br.is_function_calling_format([]) and br.is_function_calling_format([{"f": {"x": 1}}, {"g": {}}])
    assert not br.is_function_calling_format([{"f": 5}])
    assert not br.is_function_calling_format([{"f": {}, "g": {}}]) and not br.is_function_calling_format("f()")


@pytest.mark.parametrize("reply, called", [
    (text_reply("I cannot help with that."), False), (br.Reply(None, [], "stop"), False),
    (call_reply(("f", '{"x": 1}')), True), (call_reply(("f", "{}")), True),
    (call_reply(("f", "not json")), False),        # BFCL: a call that does not decode is no call
    (call_reply(("f", "[1, 2]")), False)])
def test_the_irrelevance_rule(reply: br.Reply, called: bool):
    assert br.made_call(reply) is called


def test_streamed_deltas_assemble_into_the_non_streamed_reply():
    streamed, plain = br.assemble_stream(STREAM), br.parse_message(MESSAGE)
    assert [(c.id, c.name, c.arguments) for c in streamed.tool_calls] == [
        ("s_a", "math_hypot", '{"x": 4, "y": 5}'), ("s_b", "math_factorial", '{"number": 5}')]
    assert streamed.content is None and streamed.finish_reason == "tool_calls"
    assert br.stream_differences(streamed, plain) == []


def test_streamed_content_is_joined():
    stream = [chunk({"role": "assistant"}), chunk({"content": "Hel"}), chunk({"content": "lo"}), chunk({}, "stop")]
    assert br.stream_differences(br.assemble_stream(stream), text_reply("Hello")) == []


def test_the_assembler_agrees_with_the_openai_clients_accumulator():
    deltas = pytest.importorskip("openai.lib.streaming._deltas")
    acc: dict = {}
    for c in STREAM:
        acc = deltas.accumulate_delta(acc, copy.deepcopy(c["choices"][0]["delta"]))
    ours = br.assemble_stream(STREAM)
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in acc["tool_calls"]] == [
        (c.id, c.name, c.arguments) for c in ours.tool_calls]


@pytest.mark.parametrize("stream", [[chunk({"tool_calls": [{"function": {"name": "f"}}]})],
                                    [chunk(call_delta(1, id="x", name="f", arguments="{}"))]],
                         ids=["no-index", "gap"])
def test_deltas_that_do_not_assemble_are_a_stream_error(stream: list[dict]):
    with pytest.raises(br.StreamError):
        br.assemble_stream(stream)


def test_stream_differences_name_what_differs():
    plain = br.parse_message(MESSAGE)
    other = br.assemble_stream(STREAM[:-2] + [chunk(call_delta(1, arguments='ber": 6}')), chunk({}, "stop")])
    diffs = br.stream_differences(other, plain)
    assert any("call 1 arguments" in d for d in diffs) and any("finish_reason" in d for d in diffs)
    no_id = br.assemble_stream([chunk(call_delta(0, name="math_hypot", arguments='{"x": 4, "y": 5}')),
                                chunk(call_delta(1, id="b", name="math_factorial", arguments='{"number": 5}')),
                                chunk({}, "tool_calls")])
    assert br.stream_differences(no_id, plain) == ["call 0 has no id (streamed '', non-streamed 'call_a')"]
    assert "1 tool calls != 2" in br.stream_differences(br.assemble_stream(STREAM[:3] + STREAM[-1:]), plain)


def test_sse_events_stop_at_done():
    lines = ['data: {"a": 1}', "", ": keep-alive", 'data:{"b": 2}', "data: [DONE]", 'data: {"c": 3}']
    assert list(br.sse_events(lines)) == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("reply, reasons", [
    (text_reply("Sure."), ["no_call"]), (call_reply(("f", '{"x": 1}')), []),
    (call_reply(("f", "{'x': 1}")), ["bad_json"]), (call_reply(("f", "5")), ["bad_json"]),
    (call_reply(("g", "{}")), ["undeclared_name"]),
    (call_reply(("f", "{}"), ("h", "x")), ["undeclared_name", "bad_json"])])
def test_malformed_required_calls(reply: br.Reply, reasons: list[str]):
    assert br.malformed_reasons(reply, {"f"}) == reasons


def test_calls_written_into_the_text():
    fenced = '```json\n{\n  "name": "math_factorial",\n  "arguments": {"number": 5}\n}\n```'
    assert [(c.name, json.loads(c.arguments)) for c in br.text_calls(fenced)] == [("math_factorial", {"number": 5})]
    listed = 'Calls: [{"name": "f", "arguments": {"a": [1, 2]}}, {"name": "g", "arguments": {}}]'
    assert [c.name for c in br.text_calls(listed)] == ["f", "g"]
    tagged = ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
              '<tool_call>\n{"name": "g", "arguments": {}}')
    assert [c.name for c in br.text_calls(tagged)] == ["f", "g"]
    assert br.text_calls("Use a set {1, 2} or {\"name\": \"f\"} here.") == [] and br.text_calls(None) == []


def test_the_summary_counts_each_category():
    rows = [br.CaseResult("s_0", "simple", True, 1.0, tool_calls=1, text_valid=True),
            br.CaseResult("s_1", "simple", False, 3.0, tool_calls=0, text_calls=1, text_valid=True),
            br.CaseResult("s_2", "simple", False, 0.0, error_type="http_error"),
            br.CaseResult("i_0", "irrelevance", True, 2.0)]
    summary = br.summarize(rows)
    assert list(summary) == ["simple", "irrelevance"]
    s = summary["simple"]
    assert (s["cases"], s["correct"], s["http_errors"], s["no_tool_call"], s["text_call_replies"]) == (3, 1, 1, 1, 1)
    assert s["accuracy"] == pytest.approx(1 / 3) and s["text_call_accuracy"] == pytest.approx(2 / 3)
    assert s["latency_s_mean"] == 2.0 and s["latency_s_median"] == 2.0
    assert summary["irrelevance"]["accuracy"] == 1.0


def test_the_rules_agree_with_bfcl_eval():
    utils = pytest.importorskip("bfcl_eval.utils")
    for decoded in ([], [{}], [{"f": {}}], [{"f": {"x": 1}}, {"g": {"y": [1]}}], [{"f": 5}], [{"f": {}, "g": {}}]):
        assert br.is_function_calling_format(decoded) == utils.is_function_calling_format_output(decoded)
    for calls in ([], [("f", {})], [("f", {"x": 1}), ("g", {"y": [1]})], [("f", 5)]):
        reply = call_reply(*[(name, json.dumps(args)) for name, args in calls])
        assert br.made_call(reply) == (not utils.is_empty_output([{n: a} for n, a in calls])), calls


def test_bfcl_checker_scores_hand_made_replies_on_its_own_data():
    pytest.importorskip("bfcl_eval")
    import bfcl_check

    case = bfcl_check.load_cases("simple_python", 2)[1]          # math.factorial(number=5)
    assert case.id == "simple_python_1" and case.declared == {"math_factorial"}
    assert "Python 3 syntax" in case.tools[0]["function"]["description"]
    right = bfcl_check.score(case, call_reply(("math_factorial", '{"number": 5}')), 0.1)
    wrong = bfcl_check.score(case, call_reply(("math_factorial", '{"number": 6}')), 0.1)
    fenced = '```json\n{"name": "math_factorial", "arguments": {"number": 5}}\n```'
    text = bfcl_check.score(case, text_reply(fenced), 0.1)
    assert right.valid and not wrong.valid and wrong.error_type == "value_error:others"
    assert not text.valid and text.error_type == "ast_decoder:decoder_failed" and text.text_valid
    irrelevant = bfcl_check.load_cases("irrelevance", 1)[0]
    assert bfcl_check.score(irrelevant, text_reply("No tool fits."), 0.1).valid
    assert not bfcl_check.score(irrelevant, call_reply(("determine_body_mass_index", '{"weight": 1}')), 0.1).valid
