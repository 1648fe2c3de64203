"""Tool calling on the Berkeley Function Calling Leaderboard's own data and AST checker (the `bfcl-eval`
package), through OpenAI-compatible /v1/chat/completions with `tools`, on the daemon (--ours) and on
llama.cpp's server (--peer, started with --jinja) side by side.

Each case is sent the way BFCL's OpenAI FC handler sends it: the first turn of its `question` as the
messages, its functions through bfcl-eval's `convert_to_tool` (names' "." become "_", BFCL types
become JSON-schema ones, the Python-syntax hint on each description), greedy, `tool_choice` auto.
The reply's tool calls are decoded as that handler does ([{name: json.loads(arguments)}]) and scored
by bfcl-eval's `ast_checker` under an OpenAI FC model's name (one whose checker maps "." to "_");
an irrelevance case is correct when the reply makes no call. Beside BFCL's score, each case is scored
again with the calls a text-only reply writes into its content (a JSON {"name", "arguments"} object,
fenced or not) read as its calls: not BFCL's number, but it tells a model that means the right call
from a server that returns it as `tool_calls`. For the daemon only, --stream-check
sends every case again streamed and compares the assembled deltas with the non-streamed reply, and
--required-check sends the cases that have an answer with `tool_choice: "required"` and counts the
malformed calls (arguments that are not a JSON object, undeclared names, no call at all); with both,
each `required` request is streamed and compared too.

bfcl-eval pins its own dependencies: give it its own virtual environment and run this script with its
python. From the project it imports only bfcl_replies.py and results_file.py beside it, both standard
library (no torch). bfcl-eval's checker imports its qwen-agent dependency, which imports soundfile
without declaring it, so install that too. Nothing is downloaded at run time: the data (BFCL v4 JSON
lines per category, possible answers under data/possible_answer/) ships in the package. The stream
check compares two greedy runs of each case, so it assumes the server answers a request the same
whatever else it batches with; --concurrency 1 (the default) keeps the batches alike.

    python3 -m venv /tmp/bfcl && /tmp/bfcl/bin/pip install bfcl-eval==2026.3.23 httpx soundfile
    /tmp/bfcl/bin/python benchmarks/bfcl_check.py --ours http://127.0.0.1:8000 \\
        --peer http://127.0.0.1:8302 --limit 100 --stream-check --required-check --out docs/results/bfcl.json
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

import bfcl_replies as br
import results_file

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
# the checker reads the model's name only for whether function names had "." replaced by "_"
CHECKER_MODEL = "gpt-4o-2024-11-20-FC"


@dataclass
class Case:
    id: str
    category: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]          # the OpenAI tools sent
    functions: list[dict[str, Any]]      # BFCL's function docs, as its checker reads them
    answer: list[dict[str, Any]] | None  # the possible answers; None for irrelevance

    @property
    def declared(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}


@dataclass
class Settings:
    max_tokens: int
    tool_choice: str
    timeout_s: float


def load_cases(category: str, limit: int) -> list[Case]:
    """The first `limit` cases of `category` in file order, with their tools and possible answers."""
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    prompts = load_dataset_entry(category)[:limit]
    docs = load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False)[:limit]
    answers = [None] * len(prompts) if is_irrelevance(category) else load_ground_truth_entry(category)[:limit]
    cases = []
    for prompt, doc, answer in zip(prompts, docs, answers):
        assert prompt["id"] == doc["id"] and (answer is None or answer["id"] == prompt["id"]), prompt["id"]
        tools = convert_to_tool(prompt["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
        cases.append(Case(prompt["id"], category, prompt["question"][0], tools, doc["function"],
                          None if answer is None else answer["ground_truth"]))
    return cases


def is_irrelevance(category: str) -> bool:
    return "irrelevance" in category


@functools.cache
def checker() -> Any:
    """bfcl-eval's ast_checker (its import loads every model handler: seconds, once)."""
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker

    assert MODEL_CONFIG_MAPPING[CHECKER_MODEL].underscore_to_dot, CHECKER_MODEL
    return ast_checker


def score(case: Case, reply: br.Reply, latency_s: float) -> br.CaseResult:
    """BFCL's verdict on one reply, as its eval runner gives it for an FC model; beside it, the verdict
    with the calls written into a text-only reply read as its calls."""
    result = br.CaseResult(case.id, case.category, valid=False, latency_s=latency_s,
                           tool_calls=len(reply.tool_calls), content=reply.content,
                           finish_reason=reply.finish_reason)
    result.valid, result.calls, result.error, result.error_type = verdict(case, reply)
    written = br.text_calls(reply.content) if not reply.tool_calls else []
    result.text_calls = len(written)
    result.text_valid = verdict(case, br.Reply(reply.content, written))[0] if written else result.valid
    return result


def verdict(case: Case, reply: br.Reply) -> tuple[bool, list[dict[str, Any]] | None, Any, str | None]:
    """(valid, decoded calls, error, error_type) for `reply` to `case`."""
    try:
        calls, decode_error = br.decode_calls(reply), ""
    except br.DecodeError as e:
        calls, decode_error = None, str(e)
    if is_irrelevance(case.category):
        if br.made_call(reply):
            return False, calls, "a function was called", "irrelevance_error:decoder_success"
        return True, calls, None, None
    if calls is None:
        return False, None, f"Failed to decode AST. {decode_error}", "ast_decoder:decoder_failed"
    if not br.is_function_calling_format(calls):
        return False, calls, "not a list of {name: {arg: value}}", "ast_decoder:decoder_wrong_output_format"
    from bfcl_eval.constants.enums import Language

    out = checker()(case.functions, calls, case.answer, Language.PYTHON, case.category, CHECKER_MODEL)
    return out["valid"], calls, out.get("error") or None, out.get("error_type")


class Server:
    """One OpenAI-compatible server under test."""

    def __init__(self, name: str, url: str, settings: Settings):
        self.name, self.url, self.settings = name, url.rstrip("/").removesuffix("/v1"), settings
        self.client = httpx.Client(timeout=httpx.Timeout(settings.timeout_s, connect=10))
        self.model = self._model()

    def _model(self) -> str:
        """The first model the server lists (both servers serve one)."""
        try:
            return self.client.get(f"{self.url}/v1/models").json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            return "default"

    def body(self, case: Case, tool_choice: str, stream: bool) -> dict[str, Any]:
        return {"model": self.model, "messages": case.messages, "tools": case.tools, "tool_choice": tool_choice,
                "temperature": 0, "max_tokens": self.settings.max_tokens, **({"stream": True} if stream else {})}

    def chat(self, case: Case, tool_choice: str | None = None, stream: bool = False) -> tuple[br.Reply, float]:
        """The reply and its wall time; httpx.HTTPError when the server refuses or fails."""
        body = self.body(case, tool_choice or self.settings.tool_choice, stream)
        start = time.perf_counter()
        if stream:
            with self.client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as response:
                if response.is_error:
                    response.read()
                    raise_for_reply(response)
                reply = br.assemble_stream(br.sse_events(response.iter_lines()))
        else:
            response = self.client.post(f"{self.url}/v1/chat/completions", json=body)
            raise_for_reply(response)
            reply = br.parse_message(response.json()["choices"][0])
        return reply, time.perf_counter() - start


def raise_for_reply(response: httpx.Response) -> None:
    if response.is_error:
        raise httpx.HTTPStatusError(f"HTTP {response.status_code}: {response.text[:500]}",
                                    request=response.request, response=response)


def run_case(server: Server, case: Case) -> tuple[br.CaseResult, br.Reply | None]:
    try:
        reply, latency = server.chat(case)
    except httpx.HTTPError as e:
        return br.CaseResult(case.id, case.category, valid=False, latency_s=0.0, error=str(e),
                             error_type="http_error"), None
    return score(case, reply, latency), reply


def stream_case(server: Server, case: Case, plain: br.Reply | None, tool_choice: str | None = None) -> list[str]:
    """Differences between the streamed and the non-streamed reply to `case` (empty: identical)."""
    if plain is None:
        return ["the non-streamed request failed"]
    try:
        streamed, _ = server.chat(case, tool_choice, stream=True)
    except (httpx.HTTPError, br.StreamError, ValueError) as e:
        return [f"stream failed: {e}"]
    return br.stream_differences(streamed, plain)


def required_case(server: Server, case: Case, stream: bool) -> tuple[list[str], bool, list[str]]:
    """The malformed-call reasons of the `required` reply, whether the checker accepts it and, with
    `stream`, how the same request streamed differs from it."""
    try:
        reply, latency = server.chat(case, tool_choice="required")
    except httpx.HTTPError as e:
        return [f"http_error: {str(e)[:200]}"], False, []
    diffs = stream_case(server, case, reply, "required") if stream else []
    return br.malformed_reasons(reply, case.declared), score(case, reply, latency).valid, diffs


def pmap(fn: Any, items: list[Any], concurrency: int) -> list[Any]:
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(fn, items))


def measure(server: Server, cases: dict[str, list[Case]], concurrency: int, record: dict[str, Any],
            save: Any) -> dict[str, br.Reply | None]:
    """Every case against `server`, scored into `record`; the non-streamed replies by case id."""
    replies: dict[str, br.Reply | None] = {}
    results: list[br.CaseResult] = []
    for category, rows in cases.items():
        start = time.monotonic()
        for case, (result, reply) in zip(rows, pmap(lambda c: run_case(server, c), rows, concurrency)):
            results.append(result)
            replies[case.id] = reply
        summary = br.summarize(results)
        record.update(url=server.url, model=server.model, summary=summary, cases=[asdict(r) for r in results],
                      mean_accuracy=sum(s["accuracy"] for s in summary.values()) / len(summary),
                      mean_text_call_accuracy=sum(s["text_call_accuracy"] for s in summary.values()) / len(summary))
        save()
        s = summary[category]
        print(f"{server.name} {category}: {s['correct']}/{s['cases']} in {time.monotonic() - start:.0f} s",
              file=sys.stderr, flush=True)
    return replies


def stream_check(server: Server, cases: dict[str, list[Case]], replies: dict[str, br.Reply | None],
                 concurrency: int) -> dict[str, Any]:
    out = {}
    for category, rows in cases.items():
        diffs = pmap(lambda c: stream_case(server, c, replies[c.id]), rows, concurrency)
        out[category] = {"cases": len(rows), "identical": sum(not d for d in diffs),
                         "mismatches": [{"id": c.id, "differences": d} for c, d in zip(rows, diffs) if d]}
    return out


def required_check(server: Server, cases: dict[str, list[Case]], concurrency: int, stream: bool) -> dict[str, Any]:
    """`tool_choice: "required"` on the cases with an answer; with `stream`, each streamed too (the
    replies that carry tool calls, which `auto` may never draw from a model that writes calls as text)."""
    out = {}
    for category, rows in cases.items():
        if is_irrelevance(category):
            continue
        checked = pmap(lambda c: required_case(server, c, stream), rows, concurrency)
        reasons = Counter(r.split(":")[0] for rs, _, _ in checked for r in set(rs))
        out[category] = {"cases": len(rows), "malformed": sum(bool(rs) for rs, _, _ in checked),
                         "reasons": dict(reasons), "accuracy": sum(ok for _, ok, _ in checked) / len(rows),
                         "malformed_ids": [c.id for c, (rs, _, _) in zip(rows, checked) if rs]}
        if stream:
            out[category]["stream_identical"] = sum(not d for _, _, d in checked)
            out[category]["stream_mismatches"] = [{"id": c.id, "differences": d}
                                                  for c, (_, _, d) in zip(rows, checked) if d]
    return out


def render_doc(paths: list[Path]) -> str:
    """Per category, each results file's servers: BFCL's score, the text-call diagnostic, and the daemon's
    stream and tool_choice "required" checks where a file has them."""
    runs = [(name, record) for path in paths for name, record in results_file.read(path)["servers"].items()]
    label = {"ours": "autotuned-serve", "peer": "llama.cpp --jinja"}
    rows = ["| category | " + " | ".join(f"{label.get(n, n)} BFCL | text calls" for n, _ in runs) + " |",
            "|---|" + "---:|---:|" * len(runs)]
    categories = [c for c in CATEGORIES if any(c in r["summary"] for _, r in runs)]
    for category in categories:
        cells = []
        for _, r in runs:
            s = r["summary"].get(category)
            cells += ["-", "-"] if s is None else [f"**{s['accuracy']:.2f}** ({s['correct']}/{s['cases']})",
                                                   f"{s['text_call_accuracy']:.2f}"]
        rows.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_checks(paths: list[Path]) -> str:
    """The daemon's checks per category: streamed replies against whole ones under tool_choice auto, and
    malformed calls, accuracy and the streamed replies under tool_choice "required"."""
    rows = ["| category | streamed = whole (auto) | cases (required) | malformed | accuracy | streamed = whole |",
            "|---|---:|---:|---:|---:|---:|"]
    for path in paths:
        r = results_file.read(path)
        streams, required = r.get("stream_check", {}), r.get("required_check", {})
        for category in [c for c in CATEGORIES if c in streams or c in required]:
            auto, req = streams.get(category), required.get(category)
            auto_cell = f"{auto['identical']} of {auto['cases']}" if auto else "-"
            if req is None:
                rows.append(f"| {category} | {auto_cell} | - | - | - | - |")
                continue
            streamed = f"{req['stream_identical']} of {req['cases']}" if "stream_identical" in req else "-"
            rows.append(f"| {category} | {auto_cell} | {req['cases']} | **{req['malformed']}** | "
                        f"{req['accuracy']:.2f} | {streamed} |")
    return "\n".join(rows)


def table(results: dict[str, Any]) -> str:
    servers = results["servers"]
    lines = [f"{'category':<20}" + "".join(f"{name:>22}" for name in servers)]
    for category in results["settings"]["categories"]:
        cells = []
        for record in servers.values():
            s = record.get("summary", {}).get(category)
            cells.append(f"{s['accuracy']:.3f} ({s['correct']}/{s['cases']})" if s else "-")
        lines.append(f"{category:<20}" + "".join(f"{c:>22}" for c in cells))
    lines.append(f"{'mean':<20}" + "".join(f"{r.get('mean_accuracy', 0):>22.3f}" for r in servers.values()))
    lines.append(f"{'mean, text calls':<20}" + "".join(f"{r.get('mean_text_call_accuracy', 0):>22.3f}"
                                                       for r in servers.values()))
    for category, s in results.get("stream_check", {}).items():
        lines.append(f"stream check (ours) {category}: {s['identical']}/{s['cases']} identical")
    for category, s in results.get("required_check", {}).items():
        streamed = f", streamed {s['stream_identical']}/{s['cases']} identical" if "stream_identical" in s else ""
        lines.append(f"required check (ours) {category}: {s['malformed']}/{s['cases']} malformed "
                     f"{s['reasons']}, accuracy {s['accuracy']:.3f}{streamed}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="the daemon's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--peer", help="llama.cpp's server's base URL (started with --jinja)")
    p.add_argument("--categories", nargs="+", default=list(CATEGORIES))
    p.add_argument("--limit", type=int, default=100, help="the first N cases of each category, in file order")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--tool-choice", default="auto")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once, per server")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--stream-check", action="store_true", help="ours: streamed replies equal non-streamed ones")
    p.add_argument("--required-check", action="store_true", help='ours: malformed calls under tool_choice "required"')
    p.add_argument("--out", required=True, help="the results JSON (docs/results/...)")
    args = p.parse_args()
    if not (args.ours or args.peer):
        p.error("give --ours, --peer or both")
    settings = Settings(args.max_tokens, args.tool_choice, args.timeout_s)
    cases = {category: load_cases(category, args.limit) for category in args.categories}
    results: dict[str, Any] = {
        "bfcl_eval": metadata.version("bfcl-eval"), "checker_model": CHECKER_MODEL,
        "settings": {"categories": args.categories, "limit": args.limit, "temperature": 0, **asdict(settings),
                     "concurrency": args.concurrency}, "servers": {}}
    save = functools.partial(results_file.write, Path(args.out), results)
    for name, url in (("ours", args.ours), ("peer", args.peer)):
        if not url:
            continue
        server = Server(name, url, settings)
        replies = measure(server, cases, args.concurrency, results["servers"].setdefault(name, {}), save)
        if name == "ours" and args.stream_check:
            results["stream_check"] = stream_check(server, cases, replies, args.concurrency)
        if name == "ours" and args.required_check:
            results["required_check"] = required_check(server, cases, args.concurrency, args.stream_check)
        save()
    print(table(results))


if __name__ == "__main__":
    main()
