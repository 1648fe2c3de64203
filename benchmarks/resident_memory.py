"""Resident memory of this engine on GGUF files against the bound docs/llama_cpp.md uses (the file's size x 1.3 + the KV pool):
built, serving, and idle after serving.

Each --models file is measured in a fresh interpreter (`python -P`, so one model's pages do not count
for the next), at four points:
  built    the engine built with the daemon's defaults (weights and dtype "auto") and a pool of
           --kv-tokens fp16 KV;
  served   after one 512-token prompt (a step on the dense path), a 16-token prompt decoding 32 tokens,
           and every distinct token of a text corpus looked up once in the embedding table (the pages
           real text touches: an untied table is mapped from the file, engine/model/checkpoint.py);
  idle     after LLMEngine.release_idle_memory (what the daemon's loop calls once idle: the kernels'
           scratch buffers and glibc's free heap pages given back), timed;
  all rows after every row of the embedding table was read too, and released again: the most a mapped
           table can cost.
With --daemon, the same file is also served by `autotuned-serve serve` with its defaults (calibration and
tuner on) and the same KV pool: its resident set once healthy ("built"), right after one chat request
holding the corpus's first 2,000 characters ("served"), and IDLE_S later ("idle": the engine loop
gives memory back after an idle wait). The corpus is this tree's own *.md and *.py files, tokenized by
the model's tokenizer in this (parent) process, so that the child holds only the distinct ids. Reported per point: the resident set, its
anonymous and file-backed parts, and the resident part of the mapped embedding table (where there is one).

    .venv/bin/python benchmarks/resident_memory.py --models bundled ~/.cache/autotuned-models/qwen2.5-coder-0.5b.gguf \\
        ~/.cache/autotuned-models/qwen2.5-coder-1.5b.gguf --json docs/results/resident_memory_xeon.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS_GLOBS = ("**/*.md", "**/*.py")
CORPUS_DIRS = ("autotuner", "benchmarks", "docs", "engine", "policies", "serving", "simulation", "telemetry", "tests")
IDLE_S = 3.0                       # > serving.engine_loop.IDLE_WAIT_S, and the release's own time


@dataclass
class Stage:
    rss_mb: float
    anon_mb: float
    file_mb: float
    mapped_embedding_mb: float      # resident pages of the embedding table's own map (0: none)


@dataclass
class ModelMemory:
    model: str
    gguf_mb: float
    kv_mb: float
    bound_mb: float                 # GGUF x 1.3 + KV pool
    built: Stage
    served: Stage                   # after the prompts and every distinct corpus token's lookup
    idle: Stage                     # then after release_idle_memory
    all_rows: Stage                 # then after every embedding row's lookup and release_idle_memory
    release_ms: float               # release_idle_memory's time at `idle`
    corpus_tokens: int
    distinct_tokens: int
    vocab_size: int
    daemon: dict[str, float] | None = None   # --daemon: the server's RSS MB when built, served, idle


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["bundled"], help="GGUF files; 'bundled': SmolLM2-135M")
    p.add_argument("--kv-tokens", type=int, default=4096, help="KV pool of the engine, in tokens (default 4096)")
    p.add_argument("--daemon", action="store_true", help="also measure `autotuned-serve serve` on each file")
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)   # the child: measure this GGUF, print JSON
    return p.parse_args()


def stage(mapped_path: str | None) -> Stage:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                status[key] = int(value.split()[0]) / 1024
    return Stage(status["VmRSS"], status["RssAnon"], status["RssFile"], mapped_resident_mb(mapped_path))


def mapped_resident_mb(path: str | None) -> float:
    """Resident MB of this process's maps of `path`, from /proc/self/smaps."""
    if path is None:
        return 0.0
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:      # a mapping's first line
                inside = len(head) >= 6 and os.path.realpath(head[5]) == path
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total / 1024


@dataclass
class Corpus:
    prompt: list[int]               # its first 528 tokens
    distinct: list[int]             # every token id it holds, once
    tokens: int


def read_corpus(path: str) -> Corpus:
    """This tree's text through the model's tokenizer."""
    from engine.model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("gguf", path, 0)
    ids: list[int] = []
    for folder in CORPUS_DIRS:
        for pattern in CORPUS_GLOBS:
            for file in sorted((ROOT / folder).glob(pattern)):
                ids += tokenizer.encode(file.read_text(errors="replace"))
    return Corpus(ids[:528], sorted(set(ids)), len(ids))


def measure_one(path: str, kv_tokens: int, corpus: Corpus) -> ModelMemory:
    import gc

    from engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(model=path, num_kv_blocks=kv_tokens // 16, block_size=16))
    embedding = engine.runner.model.model.embed_tokens
    # once loaded, the GGUF's only map is a mapped embedding table's: a copied table reads 0 in `stage`
    gc.collect()
    built = stage(path)
    engine.add_request(corpus.prompt[:512], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    engine.add_request(corpus.prompt[512:], SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    look_up(embedding, corpus.distinct)
    gc.collect()
    served = stage(path)
    t0 = time.perf_counter()
    engine.release_idle_memory()
    release_ms = (time.perf_counter() - t0) * 1e3
    idle = stage(path)
    look_up(embedding, list(range(engine.model_config.vocab_size)))
    gc.collect()
    engine.release_idle_memory()
    all_rows = stage(path)
    gguf_mb = os.path.getsize(path) / 2**20
    kv_mb = engine.runner.kv_cache.nbytes / 2**20
    return ModelMemory(os.path.basename(path), gguf_mb, kv_mb, gguf_mb * 1.3 + kv_mb, built, served, idle, all_rows,
                       release_ms, corpus.tokens, len(corpus.distinct), engine.model_config.vocab_size)


def look_up(embedding, ids: list[int]) -> None:
    import torch

    with torch.inference_mode():
        for chunk in torch.tensor(ids, dtype=torch.long).split(4096):
            embedding(chunk)


def expand(model: str) -> str:
    from engine.model.checkpoint import bundled_model_path

    return bundled_model_path() if model == "bundled" else os.path.expanduser(model)


def measure(model: str, kv_tokens: int) -> ModelMemory:
    """In a fresh interpreter that imports only the installed project (-P), given the corpus on stdin."""
    path = os.path.realpath(expand(model))
    corpus = json.dumps(asdict(read_corpus(path)))
    out = subprocess.run([sys.executable, "-P", __file__, "--one", path, "--kv-tokens", str(kv_tokens)], input=corpus,
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return from_row(json.loads(out.strip().splitlines()[-1]))


def measure_daemon(path: str, kv_tokens: int, workdir: str) -> dict[str, float]:
    """The daemon's resident set when healthy, right after one chat request, and IDLE_S later."""
    import urllib.request

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from llama_cpp_capacity import ServerSpec, free_port, start_server, stop_server

    port = free_port()
    argv = [sys.executable, "-P", "-m", "serving.cli", "serve", "--model", path, "--port", str(port),
            "--num-kv-blocks", str(kv_tokens // 16), "--block-size", "16", "--state-dir", os.path.join(workdir, "state")]
    spec = ServerSpec("daemon", "autotuned-serve", "defaults", tuple(argv))
    server = start_server(spec, os.path.join(workdir, "daemon.log"), port, 900)
    try:
        rss = {"built": _rss_mb(server.pid)}
        text = next(iter(sorted((ROOT / "docs").glob("*.md")))).read_text()[:2000]
        body = {"model": _served_model(port), "messages": [{"role": "user", "content": "Summarize:\n" + text}],
                "max_tokens": 16}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=900).read()
        rss["served"] = _rss_mb(server.pid)
        time.sleep(IDLE_S)
        rss["idle"] = _rss_mb(server.pid)
        return rss
    finally:
        stop_server(server)


def _served_model(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as response:
        return json.load(response)["data"][0]["id"]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def from_row(row: dict) -> ModelMemory:
    stages = {k: Stage(**row[k]) for k in ("built", "served", "idle", "all_rows")}
    return ModelMemory(**{**row, **stages})


def load_results(path: str) -> list[ModelMemory]:
    with open(path) as f:
        return [from_row(r) for r in json.load(f)["results"]]


def markdown_table(results: list[ModelMemory]) -> str:
    """RSS in MB at each point, x the bound where it matters; the mapped table's resident MB in brackets."""
    rows = ["| GGUF | MB | KV MB | bound MB | built | served | idle | idle, every embedding row read | "
            "distinct corpus tokens | release, ms | daemon: built / served / idle |",
            "|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|"]
    for r in results:
        def at(s: Stage) -> str:
            return f"{s.rss_mb:.0f}" + (f" [{s.mapped_embedding_mb:.0f}]" if s.mapped_embedding_mb else "")
        rows.append(f"| {r.model} | {r.gguf_mb:.0f} | {r.kv_mb:.0f} | {r.bound_mb:.0f} | {at(r.built)} | "
                    f"{at(r.served)} | **{at(r.idle)}** ({r.idle.rss_mb / r.bound_mb:.2f}x) | {at(r.all_rows)} "
                    f"({r.all_rows.rss_mb / r.bound_mb:.2f}x) | {r.distinct_tokens} of {r.vocab_size} | "
                    f"{r.release_ms:.0f} | {_daemon_cell(r)} |")
    return "\n".join(rows)


def _daemon_cell(r: ModelMemory) -> str:
    if not r.daemon:
        return "-"
    d = r.daemon
    return f"{d['built']:.0f} / {d['served']:.0f} / **{d['idle']:.0f}** ({d['idle'] / r.bound_mb:.2f}x)"


def render_doc(sources: list[Path]) -> str:
    """docs/llama_cpp.md's memory table (benchmarks/render_docs.py)."""
    return markdown_table([r for s in sources for r in load_results(str(s))])


def main() -> None:
    args = parse_args()
    if args.one:
        print(json.dumps(asdict(measure_one(args.one, args.kv_tokens, Corpus(**json.load(sys.stdin))))))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_common import MachineInfo, emit_summary

    results = []
    for model in args.models:
        results.append(measure(model, args.kv_tokens))
        r = results[-1]
        if args.daemon:
            with tempfile.TemporaryDirectory(prefix="resident_memory_") as workdir:
                r.daemon = measure_daemon(os.path.realpath(expand(model)), args.kv_tokens, workdir)
            print(f"{r.model}: daemon {r.daemon}", flush=True)
        print(f"{r.model}: built {r.built.rss_mb:.0f} MB, served {r.served.rss_mb:.0f} MB (bound {r.bound_mb:.0f})",
              flush=True)
    emit_summary({"machine": asdict(MachineInfo.collect()), "kv_tokens": args.kv_tokens,
                  "results": [asdict(r) for r in results]}, args.json)
    print(markdown_table(results))


if __name__ == "__main__":
    main()
