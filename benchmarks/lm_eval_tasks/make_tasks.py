"""Writes the two local lm-evaluation-harness tasks the OpenAI-surface check runs (docs/benchmarking.md):
arithmetic questions answered by loglikelihood over four choices, and the same questions answered by
generation, 240 items each, from a fixed seed, so the JSONL files in this folder are reproducible.

    python benchmarks/lm_eval_tasks/make_tasks.py      # rewrites arith_choice.jsonl and arith_generate.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
ITEMS = 240


def question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"What is {a} {op} {b}?", value


def wrong_answers(rng: random.Random, value: int) -> list[int]:
    wrong: set[int] = set()
    while len(wrong) < 3:
        candidate = value + rng.choice([-10, -2, -1, 1, 2, 10, 3, -3])
        if candidate != value:
            wrong.add(candidate)
    return sorted(wrong)


def main() -> None:
    rng = random.Random(20261201)
    choice_rows, generate_rows = [], []
    for _ in range(ITEMS):
        q, value = question(rng)
        options = wrong_answers(rng, value) + [value]
        rng.shuffle(options)
        choice_rows.append({"question": q, "choices": [str(o) for o in options], "label": options.index(value)})
        generate_rows.append({"question": q, "answer": str(value)})
    for name, rows in (("arith_choice.jsonl", choice_rows), ("arith_generate.jsonl", generate_rows)):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
