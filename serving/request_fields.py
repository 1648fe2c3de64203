"""What the server does with each field of OpenAI's request bodies: every field OpenAI's schema names is
SERVED (the request models in serving/openai_protocol.py read it), IGNORED (accepted without effect) or
REFUSED_UNLESS_DEFAULT (a 400 naming it unless it holds a value clients send by habit that asks for
nothing, e.g. `tools: []`). A null is always the same as the field being absent.

Fields outside OpenAI's schema that are not ours (vLLM extras we do not serve, anything else) are
accepted and ignored, like IGNORED fields with a value other than their defaults: both are counted in
`autotuned:ignored_request_fields_total{field}` and each name is logged once per process.
tests/test_request_fields.py checks that every field of the installed openai package is classified here.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

log = logging.getLogger(__name__)


class Policy(enum.Enum):
    SERVED = "served"
    IGNORED = "ignored"
    REFUSED_UNLESS_DEFAULT = "refused unless default"


@dataclass(frozen=True)
class Rule:
    policy: Policy
    defaults: tuple[Any, ...] = ()   # values that ask for nothing (null always does); compared with ==
    why: str = ""                    # for docs/serving.md's table


def served(why: str = "") -> Rule:
    return Rule(Policy.SERVED, (), why)


def ignored(*defaults: Any, why: str) -> Rule:
    return Rule(Policy.IGNORED, defaults, why)


def refused(*defaults: Any, why: str) -> Rule:
    return Rule(Policy.REFUSED_UNLESS_DEFAULT, defaults, why)


# both endpoints' OpenAI fields that are not served (SERVED ones are listed per endpoint below)
_COMMON = {
    "user": ignored(why="an end-user id for OpenAI's abuse monitoring"),
}

COMPLETION_FIELDS: dict[str, Rule] = {
    **{name: served() for name in (
        "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options",
        "n", "best_of", "echo", "logprobs", "presence_penalty", "frequency_penalty", "logit_bias")},
    **_COMMON,
    "suffix": refused("", why="no insertion (fill-in-the-middle) completions"),
}

CHAT_FIELDS: dict[str, Rule] = {
    **{name: served() for name in (
        "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
        "stream", "stream_options", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
        "logit_bias", "response_format", "tools", "tool_choice", "parallel_tool_calls")},
    **_COMMON,
    "metadata": ignored(why="tags for OpenAI's dashboard"),
    "store": ignored(False, why="nothing is stored for OpenAI's distillation or evals"),
    "service_tier": ignored("auto", "default", why="one tier: every request is served the same way"),
    "safety_identifier": ignored(why="an end-user id for OpenAI's abuse monitoring"),
    "prompt_cache_key": ignored(why="prefix caching needs no key here (`cache_salt` keeps tenants apart)"),
    "prompt_cache_retention": ignored("in_memory", why="cached prefixes live as long as the KV cache keeps them"),
    "prompt_cache_options": ignored(why="cached prefixes live as long as the KV cache keeps them"),
    "functions": refused([], why="the deprecated form of `tools`: send `tools`"),
    "function_call": refused("none", "auto", why="the deprecated form of `tool_choice`: send `tool_choice`"),
    "audio": refused(why="text output only"),
    "modalities": refused(["text"], why="text output only"),
    "prediction": refused(why="no predicted outputs"),
    "reasoning_effort": refused("none", why="no reasoning budget"),
    "verbosity": refused("medium", why="no verbosity control"),
    "web_search_options": refused(why="no web search"),
    "moderation": refused(why="no moderation"),
}


def field_error(title: str, field: str, message: str, value: Any) -> ValidationError:
    """A validation error located at `field`, so the API's 400 names it in `param` (raised from a
    model validator, whose own errors carry no location)."""
    return ValidationError.from_exception_data(title, [InitErrorDetails(
        type=PydanticCustomError("invalid_field", message), loc=(field,), input=value)])


def screen(title: str, rules: Mapping[str, Rule], own_fields: Iterable[str], data: dict[str, Any]) -> dict[str, Any]:
    """A request body's fields as the model should read them: nulls dropped (absent: the default applies),
    a REFUSED field with a non-default value raised as a 400 naming it, IGNORED fields with a default
    value dropped. What remains beyond `own_fields` is what the server ignores (the model's extras)."""
    own = set(own_fields)
    kept: dict[str, Any] = {}
    for name, value in data.items():
        if value is None:
            continue
        rule = rules.get(name)
        if rule is not None and name not in own:
            if _is_default(value, rule.defaults):
                continue
            if rule.policy is Policy.REFUSED_UNLESS_DEFAULT:
                raise field_error(title, name, f"{name} is not supported by this server", value)
        kept[name] = value
    return kept


def _is_default(value: Any, defaults: tuple[Any, ...]) -> bool:
    # bools compare equal to 0/1: match their type too, so `store: 0` is not `store: false`
    return any(value == d and type(value) is type(d) for d in defaults)


_logged: set[str] = set()
_logged_lock = threading.Lock()


def note_ignored(fields: Iterable[str], engine: Any = None) -> None:
    """Log each ignored field name once per process and count each in the engine's Prometheus metrics
    (PrometheusMetrics.count_ignored_field, found among the engine's arrival listeners, where the
    daemon's telemetry attaches it; an engine without telemetry counts nothing)."""
    fields = sorted(set(fields))
    if not fields:
        return
    with _logged_lock:
        new = [f for f in fields if f not in _logged]
        _logged.update(new)
    for name in new:
        log.info("ignoring request field %r (accepted without effect; counted in "
                 "autotuned:ignored_request_fields_total)", name)
    for sink in ignored_field_sinks(engine):
        for name in fields:
            sink(name)


def ignored_field_sinks(engine: Any) -> list:
    sinks = []
    for listener in getattr(engine, "arrival_listeners", ()):
        count = getattr(getattr(listener, "__self__", None), "count_ignored_field", None)
        if callable(count) and count not in sinks:
            sinks.append(count)
    return sinks


def policy_table(rules: Mapping[str, Rule], served_too: bool = False) -> list[tuple[str, Rule]]:
    """The rules in docs order: refused first, then ignored, each alphabetical."""
    order = {Policy.REFUSED_UNLESS_DEFAULT: 0, Policy.IGNORED: 1, Policy.SERVED: 2}
    return sorted(((n, r) for n, r in rules.items() if served_too or r.policy is not Policy.SERVED),
                  key=lambda item: (order[item[1].policy], item[0]))
