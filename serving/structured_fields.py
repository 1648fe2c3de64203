"""The request fields that hold a reply to a grammar, as the peers name them: OpenAI's `response_format`
(json_object, json_schema), vLLM's `structured_outputs` (json, regex, choice, grammar, structural_tag; and its
older `guided_*` fields) and llama.cpp's `json_schema` and `grammar`. At most one may be set."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError
from engine.structured.constraint import Constraint, ConstraintKind


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(default="response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of its constraint fields."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None


GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}


class StructuredFields(BaseModel):
    """Mixed into both endpoints' request models."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    json_schema: dict[str, Any] | None = None          # llama.cpp's server
    grammar: str | None = None                          # llama.cpp's server (GBNF)
    guided_json: dict[str, Any] | str | None = None     # vLLM's older names
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def constraint(self) -> Constraint | None:
        """The one constraint the body sets, None for none; a 400 when it sets several."""
        found = [c for c in (self._response_format(), *self._structured_outputs(), *self._llama_cpp(),
                             *self._guided()) if c is not None]
        if len(found) > 1:
            raise InvalidRequestError("set one output constraint (response_format, structured_outputs, "
                                      f"json_schema, grammar or guided_*), not {len(found)}", found[1].param)
        return found[0] if found else None

    def _response_format(self) -> Constraint | None:
        rf = self.response_format
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return Constraint(ConstraintKind.JSON_OBJECT, "", "response_format")
        if rf.json_schema is None or rf.json_schema.json_schema is None:
            raise InvalidRequestError("response_format json_schema needs json_schema.schema",
                                      "response_format.json_schema")
        # OpenAI's default is strict: false; either way the grammar holds the answer to the schema, and strict
        # only decides whether properties the schema does not list may appear
        return Constraint.json_schema(rf.json_schema.json_schema, "response_format.json_schema",
                                      bool(rf.json_schema.strict))

    def _structured_outputs(self) -> list[Constraint]:
        so = self.structured_outputs
        if so is None:
            return []
        return _vllm_constraints(so.json_, so.regex, so.choice, so.grammar, so.structural_tag,
                                 bool(so.json_object), "structured_outputs")

    def _llama_cpp(self) -> list[Constraint]:
        found = []
        if self.json_schema is not None:
            found.append(Constraint.json_schema(self.json_schema, "json_schema", strict=False))
        if self.grammar is not None:
            found.append(Constraint(ConstraintKind.GRAMMAR, self.grammar, "grammar"))
        return found

    def _guided(self) -> list[Constraint]:
        return _vllm_constraints(self.guided_json, self.guided_regex, self.guided_choice, self.guided_grammar,
                                 None, False, "guided_*")


def _vllm_constraints(schema: dict[str, Any] | str | None, regex: str | None, choice: list[str] | None,
                      grammar: str | None, tag: str | dict[str, Any] | None, json_object: bool,
                      param: str) -> list[Constraint]:
    found = []
    if schema is not None:
        found.append(Constraint.json_schema(_json_value(schema, param), param, strict=False))
    if regex is not None:
        found.append(Constraint(ConstraintKind.REGEX, regex, param))
    if choice is not None:
        found.append(Constraint.choice(choice, param))
    if grammar is not None:
        found.append(Constraint(ConstraintKind.GRAMMAR, grammar, param))
    if tag is not None:
        found.append(Constraint(ConstraintKind.STRUCTURAL_TAG, tag if isinstance(tag, str) else json.dumps(tag),
                                param))
    if json_object:
        found.append(Constraint(ConstraintKind.JSON_OBJECT, "", param))
    return found


def _json_value(value: dict[str, Any] | str, param: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise InvalidRequestError(f"the JSON schema is not valid JSON: {e}", param) from None
