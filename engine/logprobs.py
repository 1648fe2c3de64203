"""Log-probabilities of chosen tokens and of a row's most likely ones, as the API reports them.

One place computes them for generated tokens (the sampler) and for prompt tokens (echo, prompt
logprobs), on the device that holds the logits; only the few numbers asked for come back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()   # the row's most likely tokens and their logprobs, best first


def token_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, top_k: list[int]) -> list[TokenLogprob]:
    """`logprobs` [rows, vocab] (a log_softmax), `chosen` [rows] token ids, `top_k[i]` how many of row i's
    most likely tokens to report beside its chosen one (0: none)."""
    picked = logprobs.gather(1, chosen.view(-1, 1)).squeeze(1).tolist()
    k = max(top_k, default=0)
    if k:
        values, ids = logprobs.topk(k, dim=-1)
        values, ids = values.tolist(), ids.tolist()
    return [TokenLogprob(token, lp, tuple(zip(ids[i][:top_k[i]], values[i][:top_k[i]])) if top_k[i] else ())
            for i, (token, lp) in enumerate(zip(chosen.tolist(), picked))]
