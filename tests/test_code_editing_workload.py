"""The code-editing workload: stdlib functions sampled by seed, their chat prompts and lengths, the
preset through generate(), the bench client (chat requests carrying the message) and the simulator."""

from __future__ import annotations

import ast
import os
import textwrap

import pytest

from loadgen import code_editing
from loadgen.bench_client import BenchOptions, make_prompts, request_body, request_endpoint, run_bench
from loadgen.code_editing import (INSTRUCTION, MAX_LINES, MIN_LINES, StdlibFunction, edit_message, edit_request,
                                  module_functions, sample_functions, stdlib_dir, stdlib_functions)
from loadgen.prompts import PromptSource, load_prompt_tokenizer
from loadgen.workload import RequestSpec, generate, load_workload, parse_workload
from engine.slo_class import SloClass


@pytest.fixture(scope="module")
def tokenizer():
    return load_prompt_tokenizer(None)


def body(lines: int, indent: str = "    ") -> str:
    return "\n".join(f"{indent}x{i} = {i}" for i in range(lines))


def test_module_functions_keep_top_level_functions_and_methods_of_15_to_80_lines(tmp_path):
    source = "\n".join([
        "def short():", body(9),                        # 10 lines: too short
        "def fifteen():", body(14),                     # 15 lines: kept
        "@staticmethod", "def decorated():", body(13),  # 15 lines with its decorator: kept
        "def eighty_one():", body(80),                  # 81 lines: too long
        "def outer():", body(20), "    def inner():", body(20, " " * 8),   # inner is not top-level
        "class Box:", "    @property", "    def method(self):", body(18, " " * 8),   # 20 lines with decorator
        "    class Inner:", "        def deep(self):", body(20, " " * 12),
        "    def flush_left(self):", '        s = """', "text at column 0", '"""', body(16, " " * 8),  # does not dedent
    ]) + "\n"
    path = tmp_path / "mod.py"
    path.write_text(source)
    found = module_functions(str(path), "mod.py")
    assert [(f.name, f.num_lines) for f in found] == [("fifteen", 15), ("decorated", 15), ("outer", 42),
                                                     ("Box.method", 20)]
    method = found[-1]
    assert method.source.startswith("@property\ndef method(self):\n    x0 = 0")    # dedented, decorator kept
    assert method.line == source.split("\n").index("    @property") + 1


def test_every_stdlib_function_is_15_to_80_lines_parses_and_is_the_files_text():
    pool = stdlib_functions()
    assert len(pool) >= 200     # enough for the preset's 200 distinct functions
    assert len({(f.module, f.name, f.line) for f in pool}) == len(pool)
    for f in pool:
        assert MIN_LINES <= f.num_lines <= MAX_LINES, (f.module, f.name)
        tree = ast.parse(f.source)
        assert len(tree.body) == 1 and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
        assert tree.body[0].name == f.name.split(".")[-1]
        with open(os.path.join(stdlib_dir(), f.module), encoding="utf-8") as file:
            lines = file.read().split("\n")[f.line - 1:f.line - 1 + f.num_lines]
        assert textwrap.dedent("\n".join(lines)) == f.source


def test_the_sample_is_fixed_by_its_seed():
    a = sample_functions(50, seed=0)
    assert a == sample_functions(50, seed=0) and len(set(a)) == 50
    assert a != sample_functions(50, seed=1)
    assert set(sample_functions(10_000, seed=3)) == set(stdlib_functions())   # more than the pool: all of it
    with pytest.raises(ValueError, match="functions >= 1"):
        sample_functions(0)


class CharTokenizer:
    """One token a character, a BOS, and a template that wraps the message in 10 characters."""

    def encode(self, text: str) -> list[int]:
        return [1] + [ord(c) for c in text]

    def apply_chat_template(self, messages):
        return self.encode("<u>" + messages[0]["content"] + "</u><a>")


def test_the_prompt_holds_the_source_and_the_lengths_follow_from_it():
    function = StdlibFunction("m.py", "f", 1, "def f(a, b):\n    return a + b")
    message = edit_message(function)
    assert message.startswith(INSTRUCTION)
    assert message.endswith("```python\ndef f(a, b):\n    return a + b\n```")
    request = edit_request(function, CharTokenizer())
    assert request.message == message
    assert request.prompt_tokens == 1 + len(message) + 10
    assert request.output_tokens == round(1.3 * len(function.source) + 64)


def test_the_preset_generates_requests_whose_lengths_are_their_prompts(tokenizer):
    workload = load_workload("code-editing")
    specs = generate(workload, num_requests=250)
    assert specs == generate(workload, num_requests=250)
    assert [s.message for s in specs] != [s.message for s in generate(workload, num_requests=250, seed=1)]
    messages = [s.message for s in specs]
    assert len(set(messages[:200])) == 200               # each of the 200 functions once before any repeats
    assert set(messages[200:]) <= set(messages[:200])
    sources = {edit_message(f): f for f in sample_functions(200, seed=0)}
    assert set(messages) == set(sources)                 # the fixed draw of the preset's seed
    for spec in specs[:40]:
        function = sources[spec.message]
        assert function.source in spec.message
        chat = tokenizer.apply_chat_template([{"role": "user", "content": spec.message}])
        assert spec.prompt_tokens == len(chat)
        own = len(tokenizer.encode(function.source)) - len(tokenizer.encode(""))
        assert spec.output_tokens == round(1.3 * own + 64) > own


def test_workload_options_and_errors():
    def lengths(**extra):
        return {"phases": [{"lengths": {"kind": "code-editing", **extra}}]}

    other = generate(parse_workload("w", lengths(functions=20, seed=5)), num_requests=20)
    assert {s.message for s in other} == {edit_message(f) for f in sample_functions(20, seed=5)}
    with pytest.raises(ValueError, match="take no sharing"):
        parse_workload("w", {"phases": [{"lengths": "code-editing", "sharing": {"kind": "system-prompt"}}]})
    with pytest.raises(ValueError, match="take no sharing"):
        parse_workload("w", {"phases": [{"streams": [{"lengths": "code-editing",
                                                      "sharing": {"kind": "multi-turn"}}]}]})
    with pytest.raises(ValueError, match="take functions and seed, not 'prompt'"):
        parse_workload("w", lengths(prompt=5))
    with pytest.raises(ValueError, match="functions and seed are code-editing's"):
        parse_workload("w", {"phases": [{"lengths": {"kind": "fixed", "prompt": 5, "output": 5, "seed": 1}}]})
    assert all(s.message is None for s in generate(load_workload("chat"), num_requests=5))


def test_the_bench_client_sends_the_message_as_a_chat_request(tokenizer, monkeypatch):
    specs = generate(load_workload("code-editing"), num_requests=3) + [RequestSpec(9.0, 12, 5, "chat")]
    prompts = make_prompts(specs, PromptSource(tokenizer), text=False)
    assert prompts[:3] == [s.message for s in specs[:3]] and len(prompts[3]) == 12   # token ids for the other
    options = BenchOptions("http://127.0.0.1:9", endpoint="completions", progress=False)
    assert [request_endpoint(s, options) for s in specs] == ["chat", "chat", "chat", "completions"]
    sent = []

    async def fake_send(client, start, result, body, path, bar=None):
        sent.append((path, body))
        result.sent = result.finished = 1.0
        result.chunk_times, result.finish_reason = [1.0], "length"

    monkeypatch.setattr("loadgen.bench_client.send_at", fake_send)
    run_bench(specs, prompts, options, SloClass(), model="m")
    paths = [p for p, _ in sent]
    assert paths == ["/v1/chat/completions"] * 3 + ["/v1/completions"]
    for (_, b), spec in zip(sent[:3], specs):
        assert b["messages"] == [{"role": "user", "content": spec.message}]
        assert b["max_tokens"] == b["max_completion_tokens"] == spec.output_tokens
    assert request_body(prompts[3], specs[3], "m", "completions")["prompt"] == prompts[3]


def test_the_simulator_runs_the_preset_with_its_lengths():
    from simulation.cost_model import FEATURES, CostModel
    from simulation.workload_run import simulate

    specs = generate(load_workload("code-editing"), num_requests=12)
    cost = CostModel((0.01,) + (0.0,) * (len(FEATURES) - 1), kv_blocks=2048, block_size=16)
    run = simulate(specs, cost)
    assert run.summary.num_finished == 12
    assert sorted(r.num_output_tokens for r in run.records) == sorted(s.output_tokens for s in specs)
    assert sorted(r.num_prompt_tokens for r in run.records) == sorted(s.prompt_tokens for s in specs)


def test_a_stdlib_without_the_modules_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no functions"):
        stdlib_functions(code_editing.STDLIB_MODULES, str(tmp_path))
