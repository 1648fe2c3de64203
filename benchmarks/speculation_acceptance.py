"""How often prompt lookup drafts and how much of its drafts survive, per workload, measured live: the
simulator's speculation model (simulation/speculation_model.py; configs/speculation.yaml names the file).

Each workload's requests run one at a time through the engine in this process, greedy, to their natural
end (max_tokens a cap), with every decode verifying all the drafter offers (fixed mode, --k tokens at
most), so every decode that has a proposal is observed. Per workload:
- match_rate: verifications over decode emissions (the share of decode steps with a proposal);
- acceptance: the per-token keep probability of a geometric run length, by maximum likelihood over
  every verification (kept tokens / (kept tokens + verifications that rejected one));
- hazards: per drafted position j, the share of the verifications that reached it that kept it, apart for
  the verifications after one of the same request that kept all it drafted (`held`) and the others
  (`broken`, a request's first included): the run-length model the live estimate uses
  (engine/speculation/acceptance.py) and the simulator draws from;
- the histogram of kept tokens per verification, beside the geometric fit's, so the fit can be judged.

    .venv/bin/python benchmarks/speculation_acceptance.py --functions 24 --chat 8 \\
        --out docs/results/speculation_acceptance/bundled.json
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import results_file
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.speculation.acceptance import RunCounts
from speculation_single_stream import CHAT_PROMPTS


def observe(engine: LLMEngine, prompts: list[list[int]], k: int, max_tokens: int) -> dict[str, Any]:
    engine.set_knobs(speculative_tokens=k, speculative_mode="fixed")
    verifications: list[tuple[int, int]] = []
    states: list[bool] = []                   # whether the request's previous verification kept all it drafted
    held: dict[str, bool] = {}
    speculator = engine.scheduler.speculator
    original = speculator.observe

    def record(request_id: str, drafted: int, kept: int, knobs) -> None:
        verifications.append((drafted, kept))
        states.append(held.get(request_id, False))
        held[request_id] = kept >= drafted
        original(request_id, drafted, kept, knobs)

    speculator.observe = record
    emissions = 0
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens))
        while engine.has_unfinished():
            emissions += sum(1 for o in engine.step() if o.new_token_ids and len(o.token_ids) > len(o.new_token_ids))
    speculator.observe = original
    return fit(verifications, emissions, k) | {"hazards": {
        "held": hazards([v for v, s in zip(verifications, states) if s], k),
        "broken": hazards([v for v, s in zip(verifications, states) if not s], k)}}


def hazards(verifications: list[tuple[int, int]], k: int) -> list[float]:
    """Per drafted position 1..k: kept over reached, among verifications that reached it (counted as the
    live estimate counts them, undecayed; a position none reached takes the one before it, 0 if none)."""
    counts = RunCounts()
    for drafted, kept in verifications:
        counts.observe(drafted, kept, decay=1.0)
    out: list[float] = []
    for j in range(k):
        reached = j < len(counts.tested) and counts.tested[j] > 0
        out.append(round(counts.kept[j] / counts.tested[j], 4) if reached else (out[-1] if out else 0.0))
    return out


def fit(verifications: list[tuple[int, int]], emissions: int, k: int) -> dict[str, Any]:
    kept = sum(m for _, m in verifications)
    rejections = sum(m < d for d, m in verifications)
    acceptance = kept / (kept + rejections) if kept + rejections else 0.0
    histogram = Counter(m for _, m in verifications)
    n = len(verifications)
    geometric = {m: n * (acceptance ** m) * ((1 - acceptance) if m < k else 1.0) for m in range(k + 1)}
    return {"decode_emissions": emissions, "verifications": n, "drafted": sum(d for d, _ in verifications),
            "kept": kept, "match_rate": n / emissions if emissions else 0.0, "acceptance": acceptance,
            "kept_histogram": {str(m): histogram.get(m, 0) for m in range(k + 1)},
            "geometric_fit": {str(m): round(v, 1) for m, v in geometric.items()}}


def prompts_of(engine: LLMEngine, args: argparse.Namespace) -> dict[str, list[list[int]]]:
    from loadgen.code_editing import edit_message, sample_functions

    chat = engine.tokenizer.apply_chat_template
    code = [chat([{"role": "user", "content": edit_message(f)}]) for f in sample_functions(args.functions, args.seed)]
    talk = [chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS[:args.chat]]
    return {"code-editing": code, "chat": talk}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file or preset (default: the bundled SmolLM2)")
    p.add_argument("--functions", type=int, default=24)
    p.add_argument("--chat", type=int, default=8)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine = LLMEngine(EngineConfig(model=args.model))
    workloads = {name: observe(engine, prompts, args.k, args.max_tokens)
                 for name, prompts in prompts_of(engine, args).items()}
    results = {"meta": results_file.meta(), "model": args.model or "bundled", "k": args.k, "workloads": workloads}
    results_file.write(args.out, results)
    print(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Model: {results['model']}; every decode verifying up to {results['k']} drafted tokens.", "",
             "| workload | decode steps | with a draft | acceptance per token | kept per verification (0..k) "
             "| kept at position 1..k after a held run | after a broken one |",
             "|---|---:|---:|---:|---|---|---|"]
    for name, w in results["workloads"].items():
        hist = " ".join(str(v) for v in w["kept_histogram"].values())
        held, broken = (" ".join(f"{h:.2f}" for h in w["hazards"][s]) for s in ("held", "broken"))
        lines.append(f"| {name} | {w['decode_emissions']} | {w['match_rate']:.0%} | {w['acceptance']:.2f} | {hist} "
                     f"| {held} | {broken} |")
    return "\n".join(lines) + "\n"


def render_doc(sources) -> str:
    return "\n".join(markdown(results_file.read(s)) for s in sources)


if __name__ == "__main__":
    main()
