"""What giving back the sliding layers' KV pages buys (engine/kv_cache/kv_groups.py), on a Gemma 3 file.

The same long requests served twice on one KV pool of `--kv-mb` MB: with `hybrid_kv_cache` (pages per layer
group, the sliding groups' pages given back as each window passes) and without (every layer keeps every block,
as before). Prompts are slices of this repository's docs (text, not random ids, whose flat distributions are
full of near ties). Per run: the most KV held at once and a request's KV at its last step (MB, from the pool's
pages), the most requests running at once, preemptions, the steps taken, and how many requests' greedy tokens
match the other run's (the runs batch differently, so a near tie may part them). Counts only, no timings.

    python benchmarks/sliding_kv.py --model ~/.cache/autotuned-models/gemma-3-270m.gguf \\
        --requests 6 --prompt-tokens 3000 --max-tokens 32 --kv-mb 120 --json docs/results/sliding_kv_gemma3.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import results_file  # noqa: E402
from engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from policies import Knobs  # noqa: E402


def serve(args: argparse.Namespace, hybrid: bool) -> dict:
    engine = LLMEngine(EngineConfig(model=args.model, kv_cache_memory_mb=args.kv_mb, hybrid_kv_cache=hybrid,
                                    knobs=Knobs(token_budget=args.token_budget)))
    pool, runner = engine.block_manager, engine.runner
    page_mb = runner.kv_cache[:, :, :pool.block_size].numel() * runner.kv_cache.element_size() / 2**20
    prompts = text_prompts(engine, args.requests, args.prompt_tokens)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done: dict[str, list[int]] = {}
    peak_pages = peak_running = steps = 0
    last_pages: dict[str, int] = {}
    while engine.has_unfinished():
        last_pages |= {r.request_id: r.num_blocks for r in engine.scheduler.running}
        done |= {o.request_id: o.token_ids for o in engine.step() if o.finished}
        steps += 1
        peak_pages = max(peak_pages, pool.num_blocks - pool.num_free_blocks)
        peak_running = max(peak_running, len(engine.scheduler.running))
    groups = runner.kv_groups
    return {"hybrid_kv_cache": hybrid, "pool_pages": pool.num_blocks, "page_mb": page_mb,
            "pool_mb": pool.num_blocks * page_mb, "peak_kv_mb": peak_pages * page_mb,
            "request_kv_mb_at_end": sum(last_pages.values()) / len(last_pages) * page_mb,
            "peak_running": peak_running, "preemptions": engine.scheduler.num_preemptions, "steps": steps,
            "groups": None if groups is None else {"lanes": groups.lanes, "global": groups.num_full,
                                                    "sliding": groups.num_sliding, "window": groups.window},
            "tokens": [done[i] for i in ids]}


def text_prompts(engine: LLMEngine, count: int, length: int) -> list[list[int]]:
    """`count` prompts of `length` tokens: windows of the docs' text, each starting elsewhere."""
    root = Path(__file__).resolve().parent.parent
    text = "\n\n".join(p.read_text() for p in sorted((root / "docs").glob("*.md")))
    ids = engine.tokenizer.encode(text)
    step = max(1, (len(ids) - length) // count)
    return [ids[i * step:i * step + length] for i in range(count)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a model with sliding-window layers (Gemma 3)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-mb", type=float, default=64.0)
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--json")
    args = p.parse_args()
    runs = [serve(args, hybrid) for hybrid in (True, False)]
    same = sum(a == b for a, b in zip(runs[0]["tokens"], runs[1]["tokens"]))
    for run in runs:
        print(f"hybrid_kv_cache={run['hybrid_kv_cache']}: pool {run['pool_mb']:.1f} MB, peak KV held "
              f"{run['peak_kv_mb']:.1f} MB, a request's KV at its end {run['request_kv_mb_at_end']:.1f} MB, at most "
              f"{run['peak_running']} of {args.requests} requests running, {run['preemptions']} preemptions, "
              f"{run['steps']} steps")
    print(f"requests with the same greedy tokens in both runs: {same} of {args.requests}")
    if args.json:
        out = {"meta": results_file.meta(), "settings": vars(args), "same_tokens": same,
               "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


def render_doc(sources: list[Path]) -> str:
    """docs/design/engine.md's table (benchmarks/render_docs.py): both KV layouts of one results file."""
    r = json.loads(Path(sources[0]).read_text())
    m, st = r["meta"]["machine"], r["settings"]
    layout = {True: "pages per layer group, sliding pages given back",
              False: "every layer keeps every block (`hybrid_kv_cache: false`)"}
    g = r["runs"][0]["groups"]
    lines = [f"{Path(st['model']).name}: {g['global']} global and {g['sliding']} sliding layer groups of {g['lanes']} "
             f"lanes, window {g['window']}; {st['requests']} requests of {st['prompt_tokens']}-token prompts and "
             f"{st['max_tokens']} greedy tokens, all sent at once, on a {st['kv_mb']:g} MB pool; {m['cpu_model']}, "
             f"{m['cores']} cores.", "",
             "| KV layout | a request's KV at its last step | requests running at once | preemptions | steps |",
             "|---|---:|---:|---:|---:|"]
    for run in r["runs"]:
        lines.append(f"| {layout[run['hybrid_kv_cache']]} | {run['request_kv_mb_at_end']:.1f} MB | "
                     f"{run['peak_running']} of {st['requests']} | {run['preemptions']} | {run['steps']} |")
    lines += ["", f"Requests with the same greedy tokens in both runs: {r['same_tokens']} of {st['requests']}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
