"""Structured outputs through the API: each item of benchmarks/structured_outputs/schemas.jsonl goes to
/v1/chat/completions as OpenAI's `response_format` json_schema with `strict: true`, at temperature 0, and the answer
is parsed and validated with jsonschema (Draft 2020-12; formats checked where jsonschema has a checker installed, the
summary lists those it could not check). Then each case of unsupported.jsonl, a schema with a keyword xgrammar
cannot enforce, which the server must refuse with a 400 whose message names the keyword; with --openai-parse, the
openai package's `client.chat.completions.parse` on pydantic models, which must come back parsed.

A line of schemas.jsonl: `name`, `prompt` (asks for data of that shape), `max_tokens` (room for a valid answer
with typical content), `schema`, `example` (a valid answer). A line of unsupported.jsonl: `name`, `keywords` (the
one at fault first, then any a refusal may name instead), `prompt`, `schema`, `reason`, and a proof where one can
be shown offline: `violating` (an instance the keyword forbids that xgrammar's grammar admits) or `valid_rejected`
(a valid instance the grammar refuses). tests/test_structured_suite.py checks both files against xgrammar.

Targets: finish_reason "stop" on at least 0.9 of the schemas, every one of those valid, every unsupported case
refused naming its keyword, every parse check parsed.

    python benchmarks/structured_outputs_check.py --model $M/qwen2.5-coder-0.5b.gguf --openai-parse \\
        --out docs/results/structured_outputs_0.5b.json
    python benchmarks/structured_outputs_check.py --base-url http://127.0.0.1:8301 --label llama.cpp --openai-parse
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from jsonschema import Draft202012Validator
from pydantic import BaseModel
from referencing.exceptions import Unresolvable

import results_file
from server_health import running

ROOT = Path(__file__).resolve().parent.parent
SUITE_DIR = ROOT / "benchmarks" / "structured_outputs"
SCHEMAS = SUITE_DIR / "schemas.jsonl"
UNSUPPORTED = SUITE_DIR / "unsupported.jsonl"
SYSTEM = "Answer with JSON only."
TARGET_STOP_SHARE = 0.9
TARGET_VALID_SHARE = 1.0
KEPT_CONTENT_CHARS = 2000     # of a failed answer, in the results file
# the package jsonschema needs to check each format it has no built-in checker for
FORMAT_PACKAGES = {"date-time": "rfc3339-validator", "time": "rfc3339-validator", "uri": "rfc3987 or rfc3986-validator",
                   "uri-reference": "rfc3987 or rfc3986-validator", "iri": "rfc3987", "iri-reference": "rfc3987",
                   "hostname": "fqdn", "duration": "isoduration", "json-pointer": "jsonpointer",
                   "relative-json-pointer": "jsonpointer", "uri-template": "uri-template", "color": "webcolors"}


@dataclass(frozen=True)
class SuiteItem:
    name: str
    prompt: str
    schema: dict[str, Any]
    max_tokens: int
    example: Any            # a valid answer to the prompt: the suite's test compiles the schema and admits it


@dataclass(frozen=True)
class UnsupportedCase:
    """A schema the server must refuse with a message naming one of `keywords`; `proofs` holds the line's
    `violating` and `valid_rejected` instances (see the module's docstring). `served`: how the server enforces
    it after all (rewriting it), where it does: then its answer must validate instead."""
    name: str
    keywords: list[str]
    prompt: str
    schema: dict[str, Any]
    reason: str
    proofs: dict[str, Any] = field(default_factory=dict)
    served: str | None = None


@dataclass(frozen=True)
class ItemResult:
    name: str
    status: int | None          # HTTP status; None where the request itself failed
    finish_reason: str | None
    parses: bool
    valid: bool
    latency_s: float
    completion_tokens: int | None
    errors: list[str]           # validation errors, or what went wrong with the request
    content: str | None         # kept only where the answer failed


@dataclass(frozen=True)
class RefusalResult:
    name: str
    keywords: list[str]
    status: int | None
    names_keyword: bool         # a 400 whose message names one of the keywords
    message: str
    output_valid: bool | None   # where the server answered 200: whether the answer satisfies the schema
    handled: bool = False       # refused naming a keyword; or, for a case the server rewrites, answered validly


@dataclass(frozen=True)
class ParseResult:
    model: str
    parsed: bool                # message.parsed came back an instance of the pydantic model
    finish_reason: str | None
    latency_s: float
    error: str | None


def load_suite(path: Path = SCHEMAS) -> list[SuiteItem]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [SuiteItem(r["name"], r["prompt"], r["schema"], r["max_tokens"], r["example"]) for r in rows]


def load_unsupported(path: Path = UNSUPPORTED) -> list[UnsupportedCase]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [UnsupportedCase(r["name"], r["keywords"], r["prompt"], r["schema"], r["reason"],
                            {k: r[k] for k in ("violating", "valid_rejected") if k in r}, r.get("served"))
            for r in rows]


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def check_content(schema: dict[str, Any], content: str | None) -> tuple[bool, bool, list[str]]:
    """(parses, valid, the first validation errors) of an answer."""
    try:
        value = json.loads(content or "")
    except json.JSONDecodeError as e:
        return False, False, [f"not JSON: {e}"]
    try:
        errors = [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                  for e in validator(schema).iter_errors(value)]
    except Unresolvable as e:     # a $ref to a schema not in this one: jsonschema fetches none
        return True, False, [f"cannot validate: {e}"]
    return True, not errors, errors[:5]


def schema_formats(schema: Any) -> set[str]:
    """Every `format` value anywhere in a schema."""
    if isinstance(schema, dict):
        own = {schema["format"]} if isinstance(schema.get("format"), str) else set()
        return own.union(*(schema_formats(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(schema_formats(v) for v in schema))
    return set()


def format_coverage(items: list[SuiteItem]) -> dict[str, Any]:
    """Which of the suite's formats the installed jsonschema checks, and what the others need."""
    used = sorted(set().union(*(schema_formats(i.schema) for i in items)))
    checkers = Draft202012Validator.FORMAT_CHECKER.checkers
    return {"checked": [f for f in used if f in checkers],
            "unchecked": {f: FORMAT_PACKAGES.get(f, "no checker known") for f in used if f not in checkers}}


def request_body(model: str, name: str, prompt: str, schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}}


def post_chat(client: httpx.Client, body: dict[str, Any]) -> tuple[int | None, Any, float]:
    """(status, the JSON body or the error text, seconds)."""
    start = time.monotonic()
    try:
        r = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as e:
        return None, f"{type(e).__name__}: {e}", time.monotonic() - start
    latency = time.monotonic() - start
    try:
        return r.status_code, r.json(), latency
    except ValueError:
        return r.status_code, r.text, latency


def run_item(client: httpx.Client, model: str, item: SuiteItem) -> ItemResult:
    status, body, latency = post_chat(client, request_body(model, item.name, item.prompt, item.schema, item.max_tokens))
    if status != 200 or not isinstance(body, dict):
        return ItemResult(item.name, status, None, False, False, latency, None, [str(body)[:500]], None)
    choice = body["choices"][0]
    content = choice["message"].get("content")
    parses, valid, errors = check_content(item.schema, content)
    ok = valid and choice.get("finish_reason") == "stop"
    return ItemResult(item.name, status, choice.get("finish_reason"), parses, valid, latency,
                      (body.get("usage") or {}).get("completion_tokens"), errors,
                      None if ok else (content or "")[:KEPT_CONTENT_CHARS])


def error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)


def run_unsupported(client: httpx.Client, model: str, case: UnsupportedCase) -> RefusalResult:
    """One unsupported case, with max_tokens small: a server that refuses never generates, one that does not is
    only recorded (whether its answer happened to satisfy the schema)."""
    status, body, _ = post_chat(client, request_body(model, case.name, case.prompt, case.schema, 128))
    if status == 200 and isinstance(body, dict):
        _, valid, _ = check_content(case.schema, body["choices"][0]["message"].get("content"))
        return RefusalResult(case.name, case.keywords, status, False, "", valid, case.served is not None and valid)
    message = error_message(body)
    names = status == 400 and names_any(message, case.keywords)
    return RefusalResult(case.name, case.keywords, status, names, message[:300], None, names and case.served is None)


def names_any(message: str, keywords: list[str]) -> bool:
    """Whether `message` names one of `keywords` as a word of its own ('if' in "if/then", not in "specified")."""
    return any(re.search(rf"(?<![\w$]){re.escape(k)}(?!\w)", message) for k in keywords)


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):
    steps: list[Step]
    final_answer: str


class CalendarEvent(BaseModel):
    name: str
    date: str
    participants: list[str]


class Contact(BaseModel):
    name: str
    email: str
    kind: Literal["customer", "supplier", "partner"]
    phone: str | None

PARSE_CHECKS: list[tuple[type[BaseModel], str, int]] = [
    (MathReasoning, "Solve 8x + 7 = -23 and show your steps.", 256),
    (CalendarEvent, "Alice and Bob are going to a science fair on Friday, 2024-05-10.", 128),
    (Contact, "Add our supplier Jin Park, jin.park@example.com, no phone number.", 128),
]


def run_parse_checks(base_url: str, model: str, api_key: str, timeout_s: float) -> list[ParseResult]:
    """client.chat.completions.parse with each pydantic model of PARSE_CHECKS: the openai package builds the strict
    json_schema from the model and parses the answer back into it."""
    import openai

    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0, timeout=timeout_s)
    out = []
    for cls, prompt, max_tokens in PARSE_CHECKS:
        start = time.monotonic()
        try:
            done = client.chat.completions.parse(model=model, response_format=cls, temperature=0, max_tokens=max_tokens,
                                                 messages=[{"role": "system", "content": SYSTEM},
                                                           {"role": "user", "content": prompt}])
        except Exception as e:  # the openai package raises many types (status, length, pydantic validation)
            out.append(ParseResult(cls.__name__, False, None, time.monotonic() - start, f"{type(e).__name__}: {e}"[:500]))
            continue
        choice = done.choices[0]
        out.append(ParseResult(cls.__name__, isinstance(choice.message.parsed, cls), choice.finish_reason,
                               time.monotonic() - start, None))
    return out


def share(count: int, total: int) -> float | None:
    return count / total if total else None


def latency_summary(results: list[ItemResult]) -> dict[str, float]:
    xs = sorted(r.latency_s for r in results)
    if not xs:
        return {}
    return {"p50_s": statistics.median(xs), "p90_s": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max_s": xs[-1],
            "mean_s": statistics.fmean(xs)}


def summarize(label: str, model: str, results: list[ItemResult], refusals: list[RefusalResult],
              parses: list[ParseResult] | None, formats: dict[str, Any]) -> dict[str, Any]:
    stopped = [r for r in results if r.finish_reason == "stop"]
    stop_share = share(len(stopped), len(results))
    valid_share = share(sum(r.valid for r in stopped), len(stopped))
    refused = share(sum(r.handled for r in refusals), len(refusals))
    parsed = None if parses is None else share(sum(p.parsed for p in parses), len(parses))
    meets = (stop_share is not None and stop_share >= TARGET_STOP_SHARE and valid_share is not None
             and valid_share >= TARGET_VALID_SHARE and refused in (None, 1.0) and parsed in (None, 1.0))
    return {"label": label, "model": model, "items": len(results),
            "stop_share": stop_share, "valid_share_of_stop": valid_share,
            "valid_share": share(sum(r.valid for r in results), len(results)),
            "finish_reasons": dict(Counter(str(r.finish_reason) for r in results)),
            "latency": latency_summary(results),
            "completion_tokens": sum(r.completion_tokens or 0 for r in results),
            "unsupported_refused_share": refused, "openai_parse_share": parsed,
            "targets": {"stop_share": TARGET_STOP_SHARE, "valid_share_of_stop": TARGET_VALID_SHARE,
                        "unsupported_refused_share": 1.0, "openai_parse_share": 1.0},
            "meets_targets": meets, "formats": formats,
            "results": [asdict(r) for r in results], "unsupported": [asdict(r) for r in refusals],
            "openai_parse": None if parses is None else [asdict(p) for p in parses]}


def served_model(client: httpx.Client) -> str:
    return client.get("/v1/models").json()["data"][0]["id"]


def run_all(args: argparse.Namespace, base_url: str, items: list[SuiteItem],
            cases: list[UnsupportedCase]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(base_url=base_url, timeout=args.timeout, headers=headers) as client, \
            ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        model = served_model(client)
        results = list(pool.map(lambda item: report(run_item(client, model, item)), items))
        refusals = list(pool.map(lambda case: run_unsupported(client, model, case), cases))
    parses = run_parse_checks(base_url, model, args.api_key, args.timeout) if args.openai_parse else None
    return summarize(args.label or model, model, results, refusals, parses, format_coverage(items))


def report(r: ItemResult) -> ItemResult:
    """One line per item as it finishes (the run takes minutes on a CPU)."""
    print(f"{r.name:28s} {str(r.finish_reason):7s} valid={r.valid!s:5s} {r.latency_s:6.1f} s "
          f"{r.completion_tokens or 0:4d} tokens {'; '.join(r.errors)[:120]}", flush=True)
    return r


def daemon(args: argparse.Namespace) -> AbstractContextManager:
    """Our server on args.model, started for the run (tuner and start-up calibration off: they move the
    schedule, not the tokens, and the calibration would add a minute)."""
    cmd = [sys.executable, "-P", "-m", "serving.cli", "--model", args.model, "--port", str(args.port), "--state-dir",
           args.state_dir, "--no-tune", "--no-calibrate", *args.serve_arg]
    log = Path(args.state_dir) / "structured_outputs_daemon.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    return running(cmd, f"http://127.0.0.1:{args.port}/health", log, "daemon", cwd=ROOT)


def selected(rows: list, only: list[str] | None) -> list:
    return [r for r in rows if not only or r.name in only]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--base-url", help="an already running OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    where.add_argument("--model", help="start our server on this model (a .gguf file, an HF directory or repo id)")
    p.add_argument("--label", default=None, help="the run's name in the summary (default: the served model's id)")
    p.add_argument("--out", default=None, help="write the summary here with results_file's meta (docs/results/...)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    p.add_argument("--openai-parse", action="store_true",
                   help="also run client.chat.completions.parse of the openai package on pydantic models")
    p.add_argument("--only", action="append", default=None, metavar="NAME",
                   help="run only this schema or unsupported case (repeatable)")
    p.add_argument("--suite", type=Path, default=SCHEMAS)
    p.add_argument("--unsupported", type=Path, default=UNSUPPORTED)
    p.add_argument("--api-key", default="unused")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    p.add_argument("--port", type=int, default=8124, help="with --model: our server's port (default 8124)")
    p.add_argument("--state-dir", default="out/structured_outputs_state", help="with --model: our server's state dir")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="with --model: one more argument for our server, e.g. --serve-arg=--max-num-seqs=4 (repeatable)")
    return p


def render_doc(paths: list[Path]) -> str:
    """One row per results file: the model, its answers' finish reasons and validity, the refusals, parse."""
    rows = ["| server, model | schemas | `stop` | valid of those | unsupported handled | `parse` | median latency |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    pct = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    for path in paths:
        r = results_file.read(path)
        stopped = sum(x["finish_reason"] == "stop" for x in r["results"])
        valid = sum(x["valid"] for x in r["results"] if x["finish_reason"] == "stop")
        handled = sum(x.get("handled", x["names_keyword"]) for x in r["unsupported"])
        parsed = r["openai_parse"] or []
        rows.append(f"| {r['label']} | {r['items']} | **{pct(r['stop_share'])}** ({stopped}) | "
                    f"**{pct(r['valid_share_of_stop'])}** ({valid}) | {handled} of {len(r['unsupported'])} | "
                    f"{sum(p['parsed'] for p in parsed)} of {len(parsed)} | {r['latency']['p50_s']:.1f} s |")
    return "\n".join(rows)


def print_summary(s: dict[str, Any]) -> None:
    fmt = lambda x: "-" if x is None else f"{x:.3f}"   # noqa: E731
    print(f"\n{s['label']}: {s['items']} schemas, stop {fmt(s['stop_share'])} (target {TARGET_STOP_SHARE}), "
          f"valid of stop {fmt(s['valid_share_of_stop'])} (target {TARGET_VALID_SHARE}), finish {s['finish_reasons']}, "
          f"latency p50 {s['latency'].get('p50_s', 0):.1f} s")
    for r in s["unsupported"]:
        print(f"  unsupported {r['name']:28s} {'/'.join(r['keywords']):18s} status {r['status']} names keyword {r['names_keyword']}"
              + (f" (served; answer valid {r['output_valid']})" if r["status"] == 200 else ""))
    for p in s["openai_parse"] or []:
        print(f"  openai parse {p['model']:14s} parsed {p['parsed']} finish {p['finish_reason']} {p['error'] or ''}")
    print(f"  formats checked {s['formats']['checked']}, unchecked {s['formats']['unchecked']}")
    print(f"  meets targets: {s['meets_targets']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    items, cases = selected(load_suite(args.suite), args.only), selected(load_unsupported(args.unsupported), args.only)
    if args.model:
        with daemon(args):
            summary = run_all(args, f"http://127.0.0.1:{args.port}", items, cases)
    else:
        summary = run_all(args, args.base_url.rstrip("/"), items, cases)
    print_summary(summary)
    if args.out:
        results_file.write(args.out, summary)
    return summary


if __name__ == "__main__":
    main()
