"""Next-token choice for a batch of rows: greedy, or temperature / top-k / top-p sampling.

Greedy rows take one vectorised argmax. Sampled rows share one batched filter pass and draw with
the exponential-race trick (argmax of p / E, E ~ Exp(1)), so a per-request seed only needs its own
noise vector from its own generator.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


class Sampler:
    """Samples on the device the logits are on, so that from a GPU only token ids come back: on the H100
    machine, copying and sampling 128k-vocabulary rows on its CPU added ~4.6 ms per temperature-1 row to a
    decode step (64 rows: 306 ms; docs/gpu.md)."""

    def __init__(self, seed: int | None = None, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._request_generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams],
               banned: list[tuple[int, ...]]) -> list[int]:
        """logits: [rows, vocab] float32 on the sampler's device (changed in place where tokens are banned);
        banned: per row, token ids it may not pick yet."""
        for row, ids in enumerate(banned):
            if ids:
                logits[row, list(ids)] = float("-inf")
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, p in enumerate(params) if not p.greedy]
        if sampled:
            rows = torch.tensor(sampled, device=logits.device)
            picks = self._sample_rows(logits[rows], [request_ids[i] for i in sampled], [params[i] for i in sampled])
            tokens[rows] = picks
        return tokens.tolist()

    def _sample_rows(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> torch.Tensor:
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
        logits = logits / temperature
        if any(p.top_k > 0 for p in params):
            logits = _top_k(logits, [p.top_k for p in params])
        if any(p.top_p < 1.0 for p in params):
            logits = _top_p(logits, torch.tensor([p.top_p for p in params], device=device))
        probs = torch.softmax(logits, dim=-1)
        noise = torch.stack([self._noise(rid, p, probs.shape[1]) for rid, p in zip(request_ids, params)])
        return (probs / noise).argmax(dim=-1)

    def _noise(self, request_id: str, params: SamplingParams, size: int) -> torch.Tensor:
        generator = self._generator
        if params.seed is not None:
            generator = self._request_generators.get(request_id)
            if generator is None:
                generator = torch.Generator(device=self.device).manual_seed(params.seed)
                self._request_generators[request_id] = generator
        return torch.empty(size, device=self.device).exponential_(generator=generator)


def _top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    # clamped before the tensor: a top_k past the vocabulary (any int the API takes) cuts nothing
    k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in ks], device=logits.device)
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    # drop a token when the mass strictly before it already reaches top_p (the top token always stays)
    drop = (probs.cumsum(dim=-1) - probs) >= top_p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
