"""Which JSON-schema keywords the grammar enforces: a schema using one it would silently ignore is refused
with a 400 naming it (as OpenAI's strict mode), so that an answer that passes the grammar also validates.
Patterns are searched anywhere in a string by JSON Schema and matched whole by xgrammar: an unanchored end
is widened with `.*` before the compile (`searching_patterns`)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

from engine.errors import InvalidRequestError

# keywords xgrammar 0.2.9 compiles but does not enforce, or enforces otherwise than JSON Schema means them
# (each checked against its matcher: benchmarks/structured_outputs/unsupported.jsonl, tests/test_structured_suite.py)
UNENFORCED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
})
ENFORCED_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
    "uuid", "uri-template", "json-pointer", "relative-json-pointer",
})
# regex features outside xgrammar's regular subset: lookaround and backreferences
_IRREGULAR = re.compile(r"\(\?<?[=!]|\\[1-9]|\\k<")
# keywords whose value is a schema, or a list / map of schemas, to walk into
_SCHEMA = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames", "contains", "not", "if",
           "then", "else", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_REF_SIBLINGS_ALLOWED = frozenset({"$ref", "$defs", "definitions", "description", "title", "default", "examples",
                                   "$comment"})


def check_supported(schema: dict[str, Any], param: str, strict: bool) -> None:
    """InvalidRequestError naming the first keyword (and where it is) that the grammar would not enforce."""
    for path, node in _subschemas(schema, "#"):
        problem = _unsupported(node, strict)
        if problem:
            raise InvalidRequestError(f"the JSON schema uses {problem} at {path}, which this server cannot "
                                      "enforce", param)


def searching_patterns(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy whose `pattern`s and `patternProperties` keys match whole strings as the originals search
    them: a pattern not anchored with ^ starts with `.*`, one not anchored with $ ends with it."""
    schema = copy.deepcopy(schema)
    for _, node in _subschemas(schema, "#"):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = whole_match(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            node["patternProperties"] = {whole_match(k): v for k, v in node["patternProperties"].items()}
    return schema


def whole_match(pattern: str) -> str:
    starts, ends = pattern.startswith("^"), pattern.endswith("$") and not pattern.endswith("\\$")
    body = pattern[1 if starts else 0:len(pattern) - 1 if ends else len(pattern)]
    return f"{'' if starts else '.*'}(?:{body}){'' if ends else '.*'}"


def _unsupported(node: dict[str, Any], strict: bool) -> str | None:
    for keyword in sorted(UNENFORCED_KEYWORDS & node.keys()):
        return f"the keyword '{keyword}'"
    checks = (_format_problem, _combination_problem, _ref_problem, _string_problem, _number_problem)
    for check in checks:
        problem = check(node)
        if problem:
            return problem
    if strict or node.get("additionalProperties") is False:
        missing = sorted(set(node.get("required") or ()) - set(node.get("properties") or {}))
        if missing and not node.get("patternProperties"):
            return f"'required' naming {', '.join(map(repr, missing))}, which 'properties' does not define"
    return None


def _format_problem(node: dict[str, Any]) -> str | None:
    fmt = node.get("format")
    return f"the format '{fmt}'" if isinstance(fmt, str) and fmt not in ENFORCED_FORMATS else None


def _combination_problem(node: dict[str, Any]) -> str | None:
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "'allOf' with more than one schema"
    one_of = node.get("oneOf")
    if isinstance(one_of, list) and len(one_of) > 1 and "discriminator" not in node:
        # read as anyOf: "exactly one" holds only where the branches exclude each other (a discriminator)
        return "'oneOf' without a 'discriminator' (send 'anyOf')"
    if node.get("unevaluatedProperties", False) is not False:
        return "'unevaluatedProperties' other than false"
    return None


def _ref_problem(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    if ref is None:
        return None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return f"'$ref' to {ref!r} (only '#/...' pointers into the schema)"
    siblings = sorted(set(node) - _REF_SIBLINGS_ALLOWED)
    return f"'$ref' beside {', '.join(map(repr, siblings))}" if siblings else None


def _string_problem(node: dict[str, Any]) -> str | None:
    patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
    patterns += list(node["patternProperties"]) if isinstance(node.get("patternProperties"), dict) else []
    for pattern in patterns:
        if _IRREGULAR.search(pattern):
            return f"the pattern {pattern!r} (lookaround or a backreference)"
    if ("pattern" in node or "format" in node) and ({"minLength", "maxLength"} & node.keys()):
        return "'minLength' or 'maxLength' beside 'pattern' or 'format' (write the length into the pattern)"
    return None


def _number_problem(node: dict[str, Any]) -> str | None:
    multiple = node.get("multipleOf")
    if multiple is not None and (node.get("type") != "integer" or not float(multiple).is_integer()):
        return "'multipleOf' on a number that is not an integer"
    return None


def _subschemas(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _SCHEMA:
        if isinstance(node.get(key), dict):
            yield from _subschemas(node[key], f"{path}/{key}")
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for i, child in enumerate(node[key]):
                yield from _subschemas(child, f"{path}/{key}/{i}")
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                yield from _subschemas(child, f"{path}/{key}/{name}")
