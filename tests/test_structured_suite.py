"""benchmarks/structured_outputs/: the structured-outputs suite is well-formed, every schema compiles with xgrammar
and admits its example answer without xgrammar ignoring a constraint, every unsupported case is one xgrammar really
cannot enforce, and benchmarks/structured_outputs_check.py parses its options and scores answers as it says."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import xgrammar as xgr
from jsonschema import Draft202012Validator
from xgrammar.testing import _is_grammar_accept_string

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))   # the script imports by name
import structured_outputs_check as check  # noqa: E402

SUITE = check.load_suite()
CASES = check.load_unsupported()
VOCAB = 49152               # the bundled SmolLM2's vocabulary
# cases whose keyword compiles and whose non-enforcement no instance can show offline (jsonschema would have to
# fetch the referenced schema to judge one): the reason alone stands
REASON_ONLY = {"ref_external"}
# what the suite must exercise, as keywords and as format values
KEYWORDS = {"properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems", "enum",
            "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "format",
            "minLength", "maxLength", "$ref", "$defs", "anyOf", "minProperties", "maxProperties", "propertyNames",
            "patternProperties"}
FORMATS = {"date", "date-time", "time", "email", "uri", "uuid", "ipv4", "ipv6", "hostname"}


def keys_in(schema) -> set[str]:
    """Every keyword used anywhere in a schema (property names under `properties`/`$defs` left out)."""
    if isinstance(schema, list):
        return set().union(*(keys_in(s) for s in schema))
    if not isinstance(schema, dict):
        return set()
    found = set(schema)
    for key, value in schema.items():
        named = key in ("properties", "$defs", "patternProperties", "dependentSchemas")
        found |= set().union(*(keys_in(v) for v in value.values())) if named and isinstance(value, dict) else keys_in(value)
    return found


def walk(schema):
    """Every subschema (dict) of a schema, itself included."""
    if isinstance(schema, dict):
        yield schema
        for value in schema.values():
            yield from walk(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from walk(value)


@pytest.fixture(scope="module")
def tokenizer():
    from engine.model.checkpoint import bundled_model_path
    from engine.model.tokenizer import load_tokenizer

    return load_tokenizer("gguf", bundled_model_path(), VOCAB)._tok


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB))


def admits(grammar, text: str) -> bool:
    """Whether a compiled grammar accepts `text` whole (and may end there)."""
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.is_completed()


def test_the_suite_has_60_items_with_unique_names_prompts_and_max_tokens():
    assert len(SUITE) >= 60
    names = [i.name for i in SUITE] + [c.name for c in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    for item in SUITE:
        assert item.name.isidentifier() and len(item.prompt) >= 20, item.name
        assert isinstance(item.max_tokens, int) and 32 <= item.max_tokens <= 1024, item.name


@pytest.mark.parametrize("item", SUITE, ids=lambda i: i.name)
def test_each_schema_is_draft_2020_12_and_its_example_valid(item: check.SuiteItem):
    Draft202012Validator.check_schema(item.schema)
    assert check.check_content(item.schema, json.dumps(item.example))[1:] == (True, [])


def test_the_suite_covers_the_keywords_and_formats():
    used = set().union(*(keys_in(i.schema) for i in SUITE))
    assert KEYWORDS <= used, KEYWORDS - used
    formats = set().union(*(check.schema_formats(i.schema) for i in SUITE))
    assert FORMATS <= formats, FORMATS - formats
    nullable = [i.name for i in SUITE if '"null"' in json.dumps(i.schema)]
    optional = [i.name for i in SUITE if any(set(s.get("properties", {})) - set(s.get("required", []))
                                             for s in walk(i.schema))]
    assert len(nullable) >= 5 and len(optional) >= 5, (nullable, optional)


def test_every_pattern_of_the_suite_is_anchored():
    """xgrammar matches a pattern (and a patternProperties key pattern) against the whole string, JSON Schema
    anywhere in it: only a pattern anchored at both ends means the same to both (unsupported.jsonl's
    pattern_unanchored and pattern_properties_unanchored show the difference)."""
    patterns = [(i.name, p) for i in SUITE for s in walk(i.schema)
                for p in ([s["pattern"]] if isinstance(s.get("pattern"), str) else [])
                + list(s.get("patternProperties", {}) if isinstance(s.get("patternProperties"), dict) else [])]
    assert len(patterns) >= 30
    loose = [(name, p) for name, p in patterns if not (p.startswith("^") and p.endswith("$"))]
    assert not loose, loose


def test_each_schema_compiles_strictly_and_admits_its_example(compiler, capfd):
    """Compiled with the bundled tokenizer in strict mode, with no xgrammar warning (its warnings say a constraint
    is ignored), each grammar admits the item's example compact and indented."""
    refused = []
    for item in SUITE:
        grammar = compiler.compile_json_schema(json.dumps(item.schema), strict_mode=True)
        warned = capfd.readouterr().err
        texts = (json.dumps(item.example), json.dumps(item.example, indent=2, ensure_ascii=False))
        if "Warning" in warned or not all(admits(grammar, t) for t in texts):
            refused.append((item.name, warned.strip()[-200:]))
    assert not refused, refused


def test_max_tokens_leaves_room_for_the_indented_example(tokenizer):
    short = [(i.name, i.max_tokens, n) for i in SUITE
             if i.max_tokens < 1.25 * (n := len(tokenizer.encode(json.dumps(i.example, indent=2, ensure_ascii=False))))]
    assert not short, short


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_unsupported_case_is_one_xgrammar_cannot_enforce(case: check.UnsupportedCase):
    """Its keywords are in its schema, and xgrammar fails to compile it in strict mode, or its grammar admits an
    instance the keyword forbids, or refuses a valid one (the case's proofs); only REASON_ONLY go on their reason."""
    Draft202012Validator.check_schema(case.schema)
    assert set(case.keywords) <= keys_in(case.schema) and case.reason and len(case.prompt) >= 20
    try:
        grammar = xgr.Grammar.from_json_schema(json.dumps(case.schema), strict_mode=True)
    except RuntimeError:
        assert not case.proofs
        return
    assert case.proofs or case.name in REASON_ONLY
    valid = check.validator(case.schema).is_valid
    if "violating" in case.proofs:
        instance = case.proofs["violating"]
        assert not valid(instance) and _is_grammar_accept_string(grammar, json.dumps(instance))
    if "valid_rejected" in case.proofs:
        instance = case.proofs["valid_rejected"]
        assert valid(instance) and not _is_grammar_accept_string(grammar, json.dumps(instance))


def test_the_openai_parse_models_compile(compiler):
    """The strict schemas the openai package builds from the --openai-parse models compile with xgrammar."""
    from openai.lib._parsing._completions import type_to_response_format_param

    for cls, _, _ in check.PARSE_CHECKS:
        schema = type_to_response_format_param(cls)["json_schema"]["schema"]
        Draft202012Validator.check_schema(schema)
        compiler.compile_json_schema(json.dumps(schema), strict_mode=True)


def test_the_scripts_options_parse():
    p = check.build_parser()
    args = p.parse_args(["--base-url", "http://127.0.0.1:8301", "--label", "llama.cpp", "--out", "x.json",
                         "--concurrency", "4", "--openai-parse", "--only", "recipe"])
    assert (args.base_url, args.label, args.out, args.concurrency, args.openai_parse, args.only) == \
        ("http://127.0.0.1:8301", "llama.cpp", "x.json", 4, True, ["recipe"])
    assert p.parse_args(["--model", "m.gguf", "--serve-arg=--max-num-seqs=4"]).serve_arg == ["--max-num-seqs=4"]
    for wrong in ([], ["--base-url", "u", "--model", "m"]):
        with pytest.raises(SystemExit):
            p.parse_args(wrong)


def test_answers_are_scored_by_parse_and_schema():
    schema = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert check.check_content(schema, '{"d": "2024-02-29"}') == (True, True, [])
    assert check.check_content(schema, '{"d": "2024-02-30"}')[:2] == (True, False)
    assert check.check_content(schema, '{"d": "2024-')[:2] == (False, False)


def test_a_refusal_names_a_keyword_as_a_word():
    assert check.names_any("the JSON schema uses the keyword 'else' at #", ["if", "then", "else"])
    assert check.names_any("unsupported $ref #city", ["$ref"])
    assert not check.names_any("a field not specified", ["if"])
    assert not check.names_any("the keyword '$dynamicRef'", ["$ref"]) and not check.names_any("minContains", ["contains"])


def result(name: str, finish: str | None, valid: bool) -> check.ItemResult:
    return check.ItemResult(name, 200, finish, valid, valid, 1.0, 10, [], None)


def test_the_summary_shares_and_targets():
    results = [result(f"s{i}", "stop", True) for i in range(9)] + [result("cut", "length", False)]
    refusals = [check.RefusalResult("n", ["not"], 400, True, "not is not supported", None, True)]
    s = check.summarize("x", "m", results, refusals, None, {"checked": [], "unchecked": {}})
    assert (s["stop_share"], s["valid_share_of_stop"], s["unsupported_refused_share"], s["meets_targets"]) == \
        (0.9, 1.0, 1.0, True)
    served = [check.RefusalResult("n", ["not"], 200, False, "", True)]
    assert not check.summarize("x", "m", results, served, None, {})["meets_targets"]
    invalid = results[:8] + [result("bad", "stop", False), results[-1]]
    assert check.summarize("x", "m", invalid, refusals, None, {})["valid_share_of_stop"] == pytest.approx(8 / 9)
