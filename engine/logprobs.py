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


@dataclass(frozen=True)
class LogprobSnapshot:
    """What the logprobs of some rows need of their logits at one point of the sampler's order, in one pass
    each: the log-normaliser and the most likely tokens, plus a copy of any row that changes afterwards
    (a mask or a penalty), whose chosen token's logit must be read from before the change."""
    rows: list[int]
    log_norm: torch.Tensor                   # [len(rows)]
    top_values: torch.Tensor | None          # [len(rows), k]
    top_ids: torch.Tensor | None
    kept: dict[int, torch.Tensor]            # row -> its logits as they were

    @staticmethod
    def take(logits: torch.Tensor, rows: list[int], k: int, changing: set[int]) -> LogprobSnapshot:
        part = logits if len(rows) == logits.shape[0] else logits[torch.tensor(rows, device=logits.device)]
        part = part.float()
        top = part.topk(k, dim=-1) if k else None
        return LogprobSnapshot(rows, torch.logsumexp(part, dim=-1), top.values if top else None,
                               top.indices if top else None, {r: logits[r].clone() for r in rows if r in changing})

    def entries(self, logits: torch.Tensor, chosen: list[int], top_k: list[int]) -> list[TokenLogprob]:
        """Each row's chosen token's logprob and its `top_k` most likely ones."""
        picked = [float(self.kept[r][t]) if r in self.kept else float(logits[r, t]) for r, t in zip(self.rows, chosen)]
        norms = self.log_norm.tolist()
        if self.top_values is not None:
            values, ids = (self.top_values - self.log_norm.unsqueeze(1)).tolist(), self.top_ids.tolist()
        return [TokenLogprob(t, p - norm, tuple(zip(ids[i][:k], values[i][:k])) if k else ())
                for i, (t, p, norm, k) in enumerate(zip(chosen, picked, norms, top_k))]
