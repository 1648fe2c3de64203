"""Single-stream decode speed with and without speculative decoding: this daemon against llama.cpp's
`llama-server` at its speculation settings, on the same GGUF files, side by side in one run
(docs/speculation.md).

Workloads: code editing (stdlib functions given back with type hints and a docstring,
loadgen/code_editing.py: the output repeats the input) and chat (open questions: it seldom does). Every
request is one streamed chat completion, greedy, stopping where the model stops (max_tokens a cap).
Decode tokens per second = (completion tokens - 1) / (last token's arrival - first token's), summed over
the workload's requests, measured by the same client for every server.

Servers, for each --models file:
- this daemon (`serving.cli serve --no-tune`, one per model and --activations setting of its kernels,
  its calibration at start-up), each configuration set through POST /admin/scheduler: `off` (no speculation), `fixed-K` (every decode
  verifies all K drafted tokens the prompt lookup offers), `adaptive-K` (the step loop's priced choice,
  at most K);
- llama-server, one per configuration: `none`, its n-gram modes (`--spec-type`, from its --help) at each
  --llama-draft-max, and with --draft-model its draft model at each --llama-draft-max.
Rounds alternate the servers (--rounds; medians over rounds). Greedy outputs of the daemon's
configurations are compared with `off`'s at the same activations: speculation must not change them.

    .venv/bin/python benchmarks/speculation_single_stream.py --llama-bin /work/llama-peer/bin \\
        --models ~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf --functions 12 --chat 6 \\
        --out docs/results/speculation_single_stream/qwen0.5b.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

import results_file
from bench_common import peer_env
from server_health import running
from speculation_sweep import config_knobs

ROOT = Path(__file__).resolve().parent.parent
CHAT_PROMPTS = (
    "Explain how a hash map handles collisions, with an example.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the trade-offs between TCP and UDP for a multiplayer game?",
    "Give me a plan to learn linear algebra in three months.",
    "Why does ice float on water? Explain for a ten-year-old.",
    "Compare Python's asyncio with threads for a web scraper.",
    "Describe the water cycle and the role of the sun in it.",
    "What should I check before buying a used bicycle?",
)


@dataclass
class Reply:
    text: str
    completion_tokens: int
    decode_s: float            # first token's arrival to the last's


@dataclass
class Measured:
    server: str
    config: str
    workload: str
    round: int
    activations: str           # the daemon's kernel activations; "" for llama.cpp
    decode_tok_s: float        # summed over the workload's requests
    completion_tokens: int
    texts: list[str]


def stream_chat(client: httpx.Client, url: str, model: str, message: str, max_tokens: int) -> Reply:
    body = {"model": model, "messages": [{"role": "user", "content": message}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    first = last = None
    text, tokens = [], 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", ()):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    text.append(piece)
    return Reply("".join(text), tokens, (last - first) if first else 0.0)


def measure(url: str, messages: list[str], max_tokens: int) -> tuple[float, int, list[str]]:
    # a connection per request: llama-server may close a kept-alive one after a stream, unseen by the client
    with httpx.Client(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        replies = [stream_chat(client, url, model, m, max_tokens) for m in messages]
    decode_tokens = sum(max(0, r.completion_tokens - 1) for r in replies)
    decode_s = sum(r.decode_s for r in replies)
    return (decode_tokens / decode_s if decode_s else 0.0), sum(r.completion_tokens for r in replies), \
        [r.text for r in replies]


def workloads(args: argparse.Namespace) -> dict[str, list[str]]:
    from loadgen.code_editing import edit_message, sample_functions

    code = [edit_message(f) for f in sample_functions(args.functions, seed=args.seed)]
    return {"code-editing": code, "chat": list(CHAT_PROMPTS[:args.chat])}


# each n-gram mode's flag for its draft length (llama-server --help)
NGRAM_LENGTH_FLAGS = {"ngram-simple": "--spec-ngram-simple-size-m", "ngram-map-k": "--spec-ngram-map-k-size-m",
                      "ngram-map-k4v": "--spec-ngram-map-k4v-size-m", "ngram-mod": "--spec-ngram-mod-n-max"}


def llama_configs(args: argparse.Namespace) -> dict[str, list[str]]:
    configs: dict[str, list[str]] = {"none": []}
    for spec_type in args.llama_spec_types.split(",") if args.llama_spec_types else ():
        for k in args.llama_draft_max:
            configs[f"{spec_type}-{k}"] = ["--spec-type", spec_type, NGRAM_LENGTH_FLAGS[spec_type], str(k)]
    if args.draft_model:
        for k in args.llama_draft_max:
            configs[f"draft-model-{k}"] = ["--spec-type", "draft-simple", "-md", args.draft_model,
                                           "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
    return configs


def run_ours(args: argparse.Namespace, model: str, loads: dict[str, list[str]], round_: int,
             log_dir: Path) -> list[Measured]:
    return [m for activations in args.activations
            for m in run_daemon(args, model, activations, loads, round_, log_dir)]


def run_daemon(args: argparse.Namespace, model: str, activations: str, loads: dict[str, list[str]], round_: int,
               log_dir: Path) -> list[Measured]:
    url = f"http://127.0.0.1:{args.port}"
    state = tempfile.mkdtemp(prefix="spec-state-")
    cmd = [sys.executable, "-P", "-m", "serving.cli", "serve", "--host", "127.0.0.1", "--port", str(args.port),
           "--no-tune", "--state-dir", state, "--kernel-activations", activations] \
        + ([] if model == "bundled" else ["--model", model])
    out = []
    with running(cmd, f"{url}/health", log_dir / f"ours-{Path(model).stem}-{activations}-{round_}.log", "daemon",
                 cwd=ROOT):
        for config, knobs in config_knobs(args.ours).items():
            httpx.post(f"{url}/admin/scheduler", json={"knobs": knobs}, timeout=30).raise_for_status()
            for workload, messages in loads.items():
                rate, tokens, texts = measure(url, messages, args.max_tokens)
                out.append(Measured("ours", config, workload, round_, activations, rate, tokens, texts))
                print(f"ours {config} {activations} {workload}: {rate:.1f} tok/s", flush=True)
    return out


def run_llama(args: argparse.Namespace, model: str, loads: dict[str, list[str]], round_: int,
              log_dir: Path) -> list[Measured]:
    url = f"http://127.0.0.1:{args.port + 1}"
    server = str(Path(args.llama_bin) / "llama-server")
    out = []
    for config, extra in llama_configs(args).items():
        cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(args.port + 1), "-t", str(args.threads),
               "-c", str(args.context), "-np", "1", "--jinja", *extra]
        with running(cmd, f"{url}/health", log_dir / f"llama-{Path(model).stem}-{config}-{round_}.log", "llama-server",
                     env=peer_env()):
            for workload, messages in loads.items():
                rate, tokens, texts = measure(url, messages, args.max_tokens)
                out.append(Measured("llama.cpp", config, workload, round_, "", rate, tokens, texts))
                print(f"llama.cpp {config} {workload}: {rate:.1f} tok/s", flush=True)
    return out


def llama_version(args: argparse.Namespace) -> str:
    found = subprocess.run([str(Path(args.llama_bin) / "llama-server"), "--version"], capture_output=True, text=True)
    return (found.stdout + found.stderr).strip().splitlines()[-1] if found.returncode == 0 else "unknown"


def summarize(measured: list[Measured]) -> list[dict[str, Any]]:
    """Median over rounds per server, config and workload, with the daemon's greedy texts checked against
    its `off` configuration's."""
    groups: dict[tuple[str, str, str, str], list[Measured]] = {}
    for m in measured:
        groups.setdefault((m.server, m.config, m.activations, m.workload), []).append(m)
    reference = {(m.workload, m.activations, m.round): m.texts for m in measured
                 if m.server == "ours" and m.config == "off"}
    rows = []
    for (server, config, activations, workload), ms in groups.items():
        same = None
        if server == "ours":
            same = sum(a == b for m in ms
                       for a, b in zip(m.texts, reference.get((workload, activations, m.round), ())))
        rows.append({"server": server, "config": config, "activations": activations, "workload": workload,
                     "decode_tok_s": statistics.median(m.decode_tok_s for m in ms),
                     "rounds": [m.decode_tok_s for m in ms], "completion_tokens": ms[0].completion_tokens,
                     "requests": len(ms[0].texts), "same_as_off": same})
    return rows


def ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per workload and the daemon's activations: its best adaptive config over its `off` at the same
    activations, and over llama.cpp's best."""
    found = {}
    for workload, activations in sorted({(r["workload"], r.get("activations", "int16")) for r in rows
                                         if r["server"] == "ours"}):
        of = [r for r in rows if r["workload"] == workload]
        mine = [r for r in of if r["server"] == "ours" and r.get("activations", "int16") == activations]
        off = next(r["decode_tok_s"] for r in mine if r["config"] == "off")
        adaptive = [r for r in mine if r["config"].startswith("adaptive")]
        llama = [r["decode_tok_s"] for r in of if r["server"] == "llama.cpp"]
        best_adaptive = max(adaptive, key=lambda r: r["decode_tok_s"]) if adaptive else None
        key = workload if activations == "int16" else f"{workload}, {activations} activations"
        found[key] = {"adaptive_config": best_adaptive["config"] if best_adaptive else None,
                           "adaptive_over_off": best_adaptive["decode_tok_s"] / off if best_adaptive else None,
                           "adaptive_over_llama_best": (best_adaptive["decode_tok_s"] / max(llama)
                                                        if best_adaptive and llama else None)}
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["bundled"])
    p.add_argument("--llama-bin", default=None, help="folder with llama-server (benchmarks/build_llama_cpp.sh)")
    p.add_argument("--llama-spec-types", default="ngram-simple,ngram-map-k,ngram-mod",
                   help="comma-separated --spec-type values of llama-server to run ('' for none)")
    p.add_argument("--llama-draft-max", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--draft-model", default=None, help="a GGUF llama-server drafts with (-md), same tokenizer")
    p.add_argument("--ours", default="off,fixed:4,fixed:8,adaptive:8,adaptive:16")
    p.add_argument("--activations", nargs="+", default=["int16"], choices=["int16", "int8"],
                   help="the daemon's --kernel-activations: one daemon each, every --ours config on each")
    p.add_argument("--functions", type=int, default=12)
    p.add_argument("--chat", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--port", type=int, default=8631)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    loads = workloads(args)
    log_dir = Path(tempfile.mkdtemp(prefix="spec-logs-"))
    models = []
    for model in args.models:
        measured = []
        for round_ in range(args.rounds):
            sides = [run_ours, run_llama] if args.llama_bin and model != "bundled" else [run_ours]
            for run in sides if round_ % 2 == 0 else reversed(sides):
                measured += run(args, model, loads, round_, log_dir)
        rows = summarize(measured)
        models.append({"model": re.sub(r"^.*/\.cache/", "~/.cache/", model), "rows": rows, "ratios": ratios(rows)})
    results = {"meta": results_file.meta(), "llama_cpp": llama_version(args) if args.llama_bin else None,
               "settings": {k: v for k, v in vars(args).items() if k not in ("out",)}, "models": models}
    results_file.write(args.out, results)
    print(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    lines = []
    for m in results["models"]:
        lines += [f"**{m['model']}**", "", "| server | config | workload | decode tok/s | same greedy text as off |",
                  "|---|---|---|---:|---:|"]
        for r in sorted(m["rows"], key=lambda r: (r["workload"], r["server"] != "ours", -r["decode_tok_s"])):
            same = "" if r["same_as_off"] is None else f"{r['same_as_off']}/{r['requests'] * len(r['rounds'])}"
            server = "daemon" if r["server"] == "ours" else r["server"]
            config = r["config"] + (f" ({r['activations']})" if r.get("activations") == "int8" else "")
            lines.append(f"| {server} | {config} | {r['workload']} | {r['decode_tok_s']:.1f} | {same} |")
        lines.append("")
        for workload, q in m["ratios"].items():
            if q["adaptive_over_off"] is None:
                continue
            vs_llama = f", {q['adaptive_over_llama_best']:.2f}x llama.cpp's best" \
                if q["adaptive_over_llama_best"] else ""
            lines.append(f"- {workload}: {q['adaptive_config']} at {q['adaptive_over_off']:.2f}x no speculation"
                         f"{vs_llama}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_doc(sources: list[Path]) -> str:
    return "\n".join(markdown(results_file.read(s)) for s in sources)


if __name__ == "__main__":
    main()
