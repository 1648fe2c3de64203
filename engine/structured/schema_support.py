"""Which JSON-schema keywords the grammar enforces: a schema using one it would silently ignore is refused
with a 400 naming it (as OpenAI's strict mode), so that an answer that passes the grammar also validates."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from engine.errors import InvalidRequestError

# keywords xgrammar 0.2.9 compiles but does not enforce (checked against its matcher: tests/test_structured.py)
UNENFORCED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "uniqueItems", "contains", "minContains", "maxContains", "dependentRequired",
    "dependentSchemas", "dependencies", "unevaluatedItems",
})
ENFORCED_FORMATS = frozenset({
    "date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uri", "uri-reference",
    "uuid", "uri-template", "json-pointer", "relative-json-pointer",
})
# keywords whose value is a schema, or a list / map of schemas, to walk into
_SCHEMA = ("items", "additionalProperties", "unevaluatedProperties", "propertyNames", "contains", "not", "if",
           "then", "else", "additionalItems")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check_supported(schema_json: str, param: str) -> None:
    """InvalidRequestError naming the first keyword (and where it is) that the grammar would not enforce."""
    schema = json.loads(schema_json)
    for path, node in _subschemas(schema, "#"):
        problem = _unsupported(node)
        if problem:
            raise InvalidRequestError(f"the JSON schema uses {problem} at {path}, which this server cannot "
                                      "enforce", param)


def _unsupported(node: dict[str, Any]) -> str | None:
    for keyword in sorted(UNENFORCED_KEYWORDS & node.keys()):
        return f"the keyword '{keyword}'"
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in ENFORCED_FORMATS:
        return f"the format '{fmt}'"
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return "'allOf' with more than one schema"
    if node.get("unevaluatedProperties", False) is not False:
        return "'unevaluatedProperties' other than false"
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
