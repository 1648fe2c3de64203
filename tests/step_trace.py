"""Two runs of the same greedy requests compared step by step, per request, for as long as their histories agree.

A 16-bit run and an fp32 reference part ways where a near tie (a top-2 logit margin below the 16-bit rounding)
flips one request's token; from then on that request's logits differ by a whole token, whatever the backend.
Each request's logits rows are compared up to and including its first differing token (computed on the same
history), the other requests' rows for as long as theirs agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import LLMEngine, SamplingParams


@dataclass
class TracedStep:
    all_decode: bool
    tokens: dict[int, int]               # prompt index -> sampled token
    logits: dict[int, torch.Tensor]      # prompt index -> fp32 logits row on the CPU


@dataclass
class RowError:
    step: int
    prompt: int
    error: float           # relative norm against the reference row
    all_decode: bool
    same_token: bool


def trace_steps(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 24) -> list[TracedStep]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    index = {engine.add_request(p, params): i for i, p in enumerate(prompts)}
    steps = []
    while engine.has_unfinished():
        outputs = engine.step(return_logits=True)
        rows = [index[o.request_id] for o in outputs]
        steps.append(TracedStep(all_decode=engine.last_record.num_prefill_tokens == 0,
                                tokens={i: o.new_token_ids[0] for i, o in zip(rows, outputs)},
                                logits=dict(zip(rows, engine.last_logits.float().cpu()))))
    return steps


def errors_while_histories_agree(got: list[TracedStep], ref: list[TracedStep]) -> list[RowError]:
    parted: set[int] = set()
    errors = []
    for n, (g, r) in enumerate(zip(got, ref)):
        for i, want in r.logits.items():
            if i in parted or i not in g.logits:
                continue
            error = float((g.logits[i] - want).norm() / want.norm())
            same = g.tokens[i] == r.tokens[i]
            errors.append(RowError(n, i, error, r.all_decode, same))
            if not same:
                parted.add(i)
    return errors


def top2_margin(logits: torch.Tensor) -> float:
    top = logits.topk(2).values
    return float(top[0] - top[1])
