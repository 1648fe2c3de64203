"""What a client holds its output to: one kind of grammar and its source text, validated for size."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidRequestError

MAX_SPEC_BYTES = 64 * 1024     # a schema or grammar beyond this is refused: compile time grows with it
MAX_CHOICES = 1024


class ConstraintKind(enum.Enum):
    JSON_OBJECT = "json_object"        # any JSON object (OpenAI's JSON mode)
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    CHOICE = "choice"                  # one of a list of strings
    GRAMMAR = "grammar"                # EBNF / GBNF, as xgrammar reads it
    STRUCTURAL_TAG = "structural_tag"  # xgrammar's structural tag (tool calls, reasoning then answer)


@dataclass(frozen=True)
class Constraint:
    """`spec`: the canonical source text (JSON for schemas, choices and tags), also the compile cache's key.
    `param`: the request field it came from, named in errors."""

    kind: ConstraintKind
    spec: str = ""
    param: str = "response_format"
    strict: bool = True       # a schema's unlisted properties refused (OpenAI's strict); False: allowed

    def __post_init__(self) -> None:
        if len(self.spec.encode()) > MAX_SPEC_BYTES:
            raise InvalidRequestError(f"the {self.kind.value} constraint is {len(self.spec.encode())} bytes; "
                                      f"this server compiles at most {MAX_SPEC_BYTES}", self.param)

    @property
    def key(self) -> tuple[str, str, bool]:
        return self.kind.value, self.spec, self.strict

    @staticmethod
    def json_schema(schema: Any, param: str = "response_format", strict: bool = True) -> Constraint:
        if not isinstance(schema, dict):
            raise InvalidRequestError("a JSON schema must be an object", param)
        return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema), param, strict)

    @staticmethod
    def choice(options: Any, param: str = "structured_outputs") -> Constraint:
        if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
            raise InvalidRequestError("choice must be a non-empty list of non-empty strings", param)
        if len(options) > MAX_CHOICES:
            raise InvalidRequestError(f"choice holds at most {MAX_CHOICES} options", param)
        return Constraint(ConstraintKind.CHOICE, json.dumps(options), param)

    @staticmethod
    def structural_tag(tag: dict[str, Any], param: str = "tools") -> Constraint:
        return Constraint(ConstraintKind.STRUCTURAL_TAG, json.dumps(tag), param)

    def tag_format(self) -> dict[str, Any]:
        """The constraint as a format inside an xgrammar structural tag (to follow a reasoning block)."""
        kind, spec = self.kind, self.spec
        if kind is ConstraintKind.JSON_OBJECT:
            return {"type": "json_schema", "json_schema": {"type": "object"}}
        if kind is ConstraintKind.JSON_SCHEMA:
            return {"type": "json_schema", "json_schema": json.loads(spec)}
        if kind is ConstraintKind.REGEX:
            return {"type": "regex", "pattern": spec}
        if kind is ConstraintKind.CHOICE:
            return {"type": "grammar", "grammar": choice_grammar(spec)}
        if kind is ConstraintKind.GRAMMAR:
            return {"type": "grammar", "grammar": spec}
        tag = json.loads(spec)
        return tag["format"] if tag.get("type") == "structural_tag" else tag


def choice_grammar(options_json: str) -> str:
    """An EBNF accepting exactly one of the options (their JSON string forms are valid EBNF literals)."""
    return "root ::= " + " | ".join(json.dumps(o) for o in json.loads(options_json))
