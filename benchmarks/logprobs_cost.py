"""What logprobs cost a step: the same concurrent streams with `top_logprobs: 5` on every request and
without, in alternating rounds on one daemon (its tuner off, so both see the same configuration), the
median gap between a stream's chunks (TBT, as a client sees it) per round (docs/serving.md).

    python benchmarks/logprobs_cost.py --streams 16 --rounds 3 --json docs/results/logprobs_cost_xeon.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

import results_file
from server_health import running

ROOT = Path(__file__).resolve().parent.parent
MODES = ("plain", "top_logprobs_5")


async def one_stream(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, mode: str) -> list[float]:
    extra = {"logprobs": True, "top_logprobs": 5} if mode != "plain" else {}
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True, **extra}
    return await chat_chunk_gaps(client, body)


async def chat_chunk_gaps(client: httpx.AsyncClient, body: dict) -> list[float]:
    """The gaps between one streamed chat reply's content chunks after its first. Chunks are read as raw
    server-sent events (only a substring check per chunk), so the client's parsing, on the same cores as
    the daemon, does not grow with what the chunks carry."""
    times = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content": "' in line and '"content": ""' not in line:
                times.append(time.perf_counter())
    return [b - a for a, b in zip(times, times[1:])]


async def one_round(url: str, streams: int, max_tokens: int, mode: str) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        prompts = [f"Write a long story about a lighthouse keeper number {i} and the sea." for i in range(streams)]
        gaps = await asyncio.gather(*(one_stream(client, model, p, max_tokens, mode) for p in prompts))
    return [g for stream in gaps for g in stream]


def render_doc(paths: list[Path]) -> str:
    rows = ["| machine | streams | rounds | median TBT plain (ms) | with top_logprobs 5 (ms) | with / without |",
            "|---|---:|---:|---|---|---:|"]
    for path in paths:
        r = results_file.read(path)
        machine = r["meta"]["machine"]
        plain = [m * 1000 for m in r["median_tbt_s"]["plain"]]
        lp = [m * 1000 for m in r["median_tbt_s"]["top_logprobs_5"]]
        rows.append(f"| {machine['cpu_model']}, {machine['cores']} cores | {r['streams']} | {r['rounds']} | "
                    f"{', '.join(f'{m:.1f}' for m in plain)} | {', '.join(f'{m:.1f}' for m in lp)} | "
                    f"**{statistics.median(lp) / statistics.median(plain):.3f}x** |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="the daemon's --model (default: the bundled one)")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--json", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-P", "-m", "serving.cli", "--port", str(args.port), "--state-dir", state, "--no-tune",
               *(["--model", args.model] if args.model else [])]
        url = f"http://127.0.0.1:{args.port}"
        with running(cmd, url + "/health", Path(state) / "daemon.log", "the daemon", cwd=ROOT):
            asyncio.run(one_round(url, args.streams, 8, "plain"))             # warm-up, not counted
            medians: dict[str, list[float]] = {m: [] for m in MODES}
            for r in range(args.rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    medians[mode].append(statistics.median(asyncio.run(one_round(url, args.streams, args.max_tokens,
                                                                                 mode))))
    results_file.write(args.json, {"streams": args.streams, "rounds": args.rounds, "max_tokens": args.max_tokens,
                                   "model": args.model or "bundled", "median_tbt_s": medians})
    print(render_doc([Path(args.json)]))


if __name__ == "__main__":
    main()
