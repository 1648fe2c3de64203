"""What constrained decoding costs, on one daemon per part (its tuner off, so every mode sees the same
configuration), modes alternating round by round, medians over rounds (docs/structured_outputs.md):

- `tbt`: the same concurrent chat streams held to a JSON schema (loadgen.bench_client.BENCH_SCHEMA: records
  without end, so the answer runs to max_tokens as ignore_eos does) and unconstrained with ignore_eos, at each
  --streams level: the P50 and P99 of the gaps between a stream's chunks (one gap per emission);
- `jump_forward`: requests whose schema has long fixed keys, on a daemon with jump-forward and one with
  --no-jump-forward (both uncalibrated: the same shipped cost model): output tokens per second of the whole
  batch, and whether the answers are the same;
- `goodput`: open-loop Poisson arrivals at --qps (0.9x the all-text sustained chat capacity) of the chat
  workload, all text and half constrained: requests within the SLO per second.

    python benchmarks/structured_cost.py --model $M/qwen2.5-coder-0.5b.gguf --parts tbt,jump_forward,goodput \
        --config benchmarks/slo_0.5b.yaml --streams 1,8,32 --rounds 3 --qps 0.34 --goodput-rounds 1 \
        --json docs/results/structured_cost_0.5b_xeon.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

import results_file
from logprobs_cost import chat_chunk_gaps
from server_health import running

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from engine.slo_class import SloClass  # noqa: E402
from loadgen.bench_client import BENCH_SCHEMA, BenchOptions, make_prompts, run_bench  # noqa: E402
from loadgen.prompts import PromptSource, load_prompt_tokenizer  # noqa: E402
from loadgen.workload import CHAT, Phase, Stream, Workload, generate  # noqa: E402

PARTS = ("tbt", "jump_forward", "goodput")
TBT_MODES = ("text", "json_schema")
# long fixed keys and short values: most of an answer is forced
LONG_KEYS = {"type": "object", "additionalProperties": False, "properties": {
    key: {"type": "string", "maxLength": 12} for key in (
        "customer_full_legal_name_as_on_record", "customer_primary_shipping_address_line",
        "customer_preferred_contact_email_address", "order_fulfilment_warehouse_identifier",
        "order_expected_delivery_date_iso8601", "order_payment_method_description")}}
LONG_KEYS["required"] = list(LONG_KEYS["properties"])


@contextmanager
def daemon(model: str | None, port: int, *flags: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-P", "-m", "serving.cli", "--port", str(port), "--state-dir", state, "--no-tune",
               *(["--model", model] if model else []), *flags]
        url = f"http://127.0.0.1:{port}"
        with running(cmd, url + "/health", Path(state) / "daemon.log", "the daemon", cwd=ROOT):
            yield url


async def stream_gaps(client: httpx.AsyncClient, prompt: str, max_tokens: int, mode: str) -> list[float]:
    """One chat stream's gaps between content chunks after its first, read as raw server-sent events."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True}
    if mode == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "records", "schema": BENCH_SCHEMA}}
    return await chat_chunk_gaps(client, body)


async def tbt_round(url: str, streams: int, max_tokens: int, mode: str) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        prompts = [f"List the items of store number {i} as JSON records with id, name, score and tags."
                   for i in range(streams)]
        gaps = await asyncio.gather(*(stream_gaps(client, p, max_tokens, mode) for p in prompts))
    return [g for stream in gaps for g in stream]


def measure_tbt(url: str, levels: list[int], rounds: int, max_tokens: int) -> dict:
    asyncio.run(tbt_round(url, 2, 8, "json_schema"))      # warm-up (and the schema's compile), not counted
    found: dict = {}
    for streams in levels:
        per_mode: dict[str, dict[str, list[float]]] = {m: {"p50_s": [], "p99_s": []} for m in TBT_MODES}
        for r in range(rounds):
            for mode in (TBT_MODES if r % 2 == 0 else TBT_MODES[::-1]):
                gaps = asyncio.run(tbt_round(url, streams, max_tokens, mode))
                per_mode[mode]["p50_s"].append(float(np.percentile(gaps, 50)))
                per_mode[mode]["p99_s"].append(float(np.percentile(gaps, 99)))
        found[str(streams)] = per_mode
    return found


def jump_forward_batch(url: str, requests: int) -> dict:
    body = {"max_tokens": 400, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": LONG_KEYS}}}
    prompts = [f"Invent order number {i} of a customer, as JSON." for i in range(requests)]

    async def one(client: httpx.AsyncClient, prompt: str) -> dict:
        r = await client.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": prompt}]})
        r.raise_for_status()
        return r.json()

    async def batch() -> tuple[float, list[dict]]:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            await one(client, "warm-up")
            start = time.perf_counter()
            replies = await asyncio.gather(*(one(client, p) for p in prompts))
            return time.perf_counter() - start, replies

    seconds, replies = asyncio.run(batch())
    tokens = sum(r["usage"]["completion_tokens"] for r in replies)
    return {"seconds": seconds, "completion_tokens": tokens, "tokens_per_s": tokens / seconds,
            "answers": [r["choices"][0]["message"]["content"] for r in replies],
            "finish_reasons": [r["choices"][0]["finish_reason"] for r in replies]}


def measure_jump_forward(model: str | None, port: int, requests: int, rounds: int) -> dict:
    runs: dict[str, list[dict]] = {"jump_forward": [], "no_jump_forward": []}
    for r in range(rounds):
        for mode in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            flags = ("--no-calibrate",) + (() if mode == "jump_forward" else ("--no-jump-forward",))
            with daemon(model, port, *flags) as url:
                runs[mode].append(jump_forward_batch(url, requests))
    on, off = runs["jump_forward"][0]["answers"], runs["no_jump_forward"][0]["answers"]
    return {"runs": runs, "same_answers": sum(a == b for a, b in zip(on, off)), "requests": requests,
            "speedup": statistics.median(x["tokens_per_s"] for x in runs["jump_forward"])
            / statistics.median(x["tokens_per_s"] for x in runs["no_jump_forward"])}


def goodput_workload(constrained: bool) -> Workload:
    streams = (Stream("text", lengths=CHAT, rate=0.5), Stream("json", lengths=CHAT, rate=0.5, constrained=constrained))
    return Workload("chat-half-constrained" if constrained else "chat", (Phase("chat", streams=streams),))


def measure_goodput(url: str, model: str | None, qps: float, duration_s: float, slo: SloClass,
                    rounds: int) -> dict:
    source = PromptSource(load_prompt_tokenizer(model))
    found: dict[str, list[dict]] = {"text": [], "half_constrained": []}
    for r in range(rounds):
        for mode in (list(found) if r % 2 == 0 else list(found)[::-1]):
            # the same arrivals, lengths and prompts for both modes of a round: only the constraint differs
            specs = generate(goodput_workload(mode != "text"), qps=qps, duration_s=duration_s, seed=r)
            options = BenchOptions(url, endpoint="chat", progress=False, max_duration_s=duration_s * 3)
            run = run_bench(specs, make_prompts(specs, source, text=True), options, slo)
            s = run.summary
            found[mode].append({"goodput_rps": s.goodput_rps, "requests": s.num_requests,
                                "ttft_p50_s": s.ttft_p50_s, "tbt_p99_s": s.tbt_p99_s})
    ratio = statistics.median(x["goodput_rps"] for x in found["half_constrained"]) / \
        statistics.median(x["goodput_rps"] for x in found["text"])
    return {"qps": qps, "duration_s": duration_s, "runs": found, "ratio": ratio}


def _ratio(numerator: list[float], denominator: list[float]) -> float:
    return statistics.median(numerator) / statistics.median(denominator)


def render_doc(paths: list[Path]) -> str:
    """One table per part the results files hold."""
    out = []
    for path in paths:
        r = results_file.read(path)
        m = r["meta"]["machine"]
        where = f"{Path(r['model']).name}, {m['cpu_model']}, {m['cores']} cores, {r['rounds']} rounds"
        if "tbt" in r:
            out += [f"TBT of JSON-schema streams against unconstrained ones ({where}; medians over rounds, ms):", "",
                    "| streams | P50 text | P50 schema | ratio | P99 text | P99 schema | ratio |",
                    "|---:|---:|---:|---:|---:|---:|---:|"]
            for streams, modes in r["tbt"].items():
                t, j = modes["text"], modes["json_schema"]
                out.append(f"| {streams} | {statistics.median(t['p50_s']) * 1e3:.1f} | "
                           f"{statistics.median(j['p50_s']) * 1e3:.1f} | **{_ratio(j['p50_s'], t['p50_s']):.2f}x** | "
                           f"{statistics.median(t['p99_s']) * 1e3:.1f} | {statistics.median(j['p99_s']) * 1e3:.1f} | "
                           f"**{_ratio(j['p99_s'], t['p99_s']):.2f}x** |")
            out.append("")
        if "jump_forward" in r:
            jf = r["jump_forward"]
            on, off = jf["runs"]["jump_forward"], jf["runs"]["no_jump_forward"]
            out += [f"Jump-forward on a schema of long fixed keys ({where}; {jf['requests']} concurrent requests):", "",
                    "| | output tokens/s | batch seconds | answers finished |", "|---|---:|---:|---:|"]
            for label, runs in (("jump-forward", on), ("--no-jump-forward", off)):
                done = sum(f == "stop" for f in runs[0]["finish_reasons"])
                out.append(f"| {label} | {statistics.median(x['tokens_per_s'] for x in runs):.1f} | "
                           f"{statistics.median(x['seconds'] for x in runs):.1f} | {done} of {jf['requests']} |")
            out += ["", f"Output tokens per second **{jf['speedup']:.2f}x**; batch time "
                        f"**{statistics.median(x['seconds'] for x in off) / statistics.median(x['seconds'] for x in on):.2f}x** "
                        f"shorter; {jf['same_answers']} of {jf['requests']} answers identical.", ""]
        if "goodput" in r:
            g = r["goodput"]
            text = [x["goodput_rps"] for x in g["runs"]["text"]]
            half = [x["goodput_rps"] for x in g["runs"]["half_constrained"]]
            machine = f"{Path(r['model']).name}, {m['cpu_model']}, {m['cores']} cores"
            out += [f"Goodput at {g['qps']} req/s of chat, {g['duration_s']:.0f} s of arrivals a run ({machine}):", "",
                    "| traffic | goodput (req/s) per round |", "|---|---|",
                    f"| all text | {', '.join(f'{x:.3f}' for x in text)} |",
                    f"| half JSON-schema | {', '.join(f'{x:.3f}' for x in half)} |", "",
                    f"Half constrained over all text: **{g['ratio']:.2f}x**.", ""]
    return "\n".join(out).rstrip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="the daemon's --model (default: the bundled one)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--streams", default="1,8,32", help="concurrent streams of the tbt part, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--jump-requests", type=int, default=8)
    p.add_argument("--qps", type=float, default=None, help="goodput part: the arrival rate (0.9x capacity)")
    p.add_argument("--duration-s", type=float, default=150.0, help="goodput part: seconds of arrivals per run")
    p.add_argument("--goodput-rounds", type=int, default=1, help="goodput part: rounds of the two modes")
    p.add_argument("--slo-ttft-s", type=float, default=4.0)
    p.add_argument("--slo-tbt-s", type=float, default=0.25)
    p.add_argument("--port", type=int, default=8126)
    p.add_argument("--config", default=None, help="the daemon's --config (the SLO settings its capacity was measured with)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    parts = args.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        p.error(f"unknown parts {', '.join(sorted(unknown))} (known: {', '.join(PARTS)})")
    if "goodput" in parts and args.qps is None:
        p.error("the goodput part needs --qps")
    found: dict = {"model": args.model or "bundled", "rounds": args.rounds, "max_tokens": args.max_tokens}
    config = ("--config", args.config) if args.config else ()
    if "tbt" in parts or "goodput" in parts:
        with daemon(args.model, args.port, *config) as url:
            if "tbt" in parts:
                found["tbt"] = measure_tbt(url, [int(s) for s in args.streams.split(",")], args.rounds,
                                           args.max_tokens)
            if "goodput" in parts:
                found["goodput"] = measure_goodput(url, args.model, args.qps, args.duration_s,
                                                   SloClass("run", args.slo_ttft_s, args.slo_tbt_s),
                                                   args.goodput_rounds)
    if "jump_forward" in parts:
        found["jump_forward"] = measure_jump_forward(args.model, args.port, args.jump_requests, args.rounds)
    results_file.write(args.json, found)
    print(render_doc([Path(args.json)]))


if __name__ == "__main__":
    main()
