"""Next-token choice for a batch of rows, in one order for everything that shapes a row's distribution:

1. the mask: the grammar's (a constrained request: engine/structured/) and the tokens a row may not pick
   yet (min_tokens keeps its stop tokens out). A greedy constrained row that asks no logprobs is masked
   only where its pick is refused: the unmasked argmax, when the grammar allows it, is the masked one, and
   a model that follows its format seldom needs the mask (the full-vocabulary pass costs ~0.3 ms a row);
2. logit bias, then repetition, frequency and presence penalties (vectorised over the rows that set them);
3. logprobs, where a row asks: from the model's raw logits (`logprobs_mode="raw"`, vLLM's default) or from
   the logits after steps 1-2 (`"processed"`), before temperature and truncation either way;
4. temperature, then top-k, top-p and min-p;
5. the draw: greedy rows take one vectorised argmax; sampled rows draw with the exponential-race trick
   (argmax of p / E, E ~ Exp(1)); a seeded request's noise for its output position i comes from a
   generator seeded by (seed, i), so its tokens depend neither on how the step was shaped nor on how
   many drafted positions a step verified (engine/speculation/verification.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.logprobs import LogprobSnapshot, TokenLogprob
from engine.sampling_params import SamplingParams
from engine.structured.step_masks import FilledMasks, apply_masks, refused

LOGPROBS_MODES = ("raw", "processed")


@dataclass(frozen=True)
class SampleRow:
    """What the sampler needs of one request: its parameters, its mask, and its tokens (for penalties)."""
    request_id: str
    params: SamplingParams
    banned: tuple[int, ...] = ()
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()
    position: int = 0           # the output position this row draws (keys a seeded request's noise)


@dataclass(frozen=True)
class SampledTokens:
    tokens: list[int]
    logprobs: list[TokenLogprob | None]     # per row; None where the row asked for none


class Sampler:
    """Samples on the device the logits are on, so that from a GPU only token ids come back: on the H100
    machine, copying and sampling 128k-vocabulary rows on its CPU added ~4.6 ms per temperature-1 row to a
    decode step (64 rows: 306 ms; docs/gpu.md)."""

    def __init__(self, seed: int | None = None, device: str | torch.device = "cpu", logprobs_mode: str = "raw") -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        self.device = torch.device(device)
        self.logprobs_mode = logprobs_mode
        self._generator = torch.Generator(device=self.device)
        if seed is not None:
            self._generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: list[SampleRow], masks: FilledMasks | None = None) -> SampledTokens:
        """logits: [rows, vocab] float32 on the sampler's device, changed in place; `masks`: the grammar
        masks of the constrained rows."""
        asking = [i for i, r in enumerate(rows) if r.params.logprobs is not None]
        changing = {i for i, r in enumerate(rows) if r.banned or r.params.shapes_logits}
        deferred: list[int] = []       # greedy constrained rows without logprobs: masked where refused
        if masks is not None:
            changing.update(masks.rows)
            deferred = [i for i in masks.rows if rows[i].params.greedy and rows[i].params.logprobs is None]
        # a step whose rows all ask and are all greedy takes its tokens from the logprobs' top-1: one pass less
        top_is_pick = bool(asking) and len(asking) == len(rows) and all(r.params.greedy for r in rows) and \
            (not changing or self.logprobs_mode == "processed")
        k = max((rows[i].params.logprobs for i in asking), default=0) or int(top_is_pick)
        snapshot = None
        if asking and self.logprobs_mode == "raw":
            snapshot = LogprobSnapshot.take(logits, asking, k, changing)
        if masks is not None and len(deferred) < len(masks.rows):
            apply_masks(logits, masks, [i for i in masks.rows if i not in set(deferred)])
        for row, r in enumerate(rows):
            if r.banned:
                logits[row, list(r.banned)] = float("-inf")
        shaping = [i for i, r in enumerate(rows) if r.params.shapes_logits]
        if shaping:
            apply_bias_and_penalties(logits, shaping, rows)
        if asking and snapshot is None:
            snapshot = LogprobSnapshot.take(logits, asking, k, set())
        tokens = snapshot.top_ids[:, 0].clone() if top_is_pick else logits.argmax(dim=-1)
        if deferred:
            self._pick_within_masks(logits, tokens, masks, deferred)
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        if sampled:
            index = torch.tensor(sampled, device=logits.device)
            tokens[index] = self._sample_rows(logits[index], [rows[i] for i in sampled])
        chosen = tokens.tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(rows)
        if asking:
            found = snapshot.entries(logits, [chosen[i] for i in asking], [rows[i].params.logprobs for i in asking])
            for i, lp in zip(asking, found):
                logprobs[i] = lp
        return SampledTokens(chosen, logprobs)

    @staticmethod
    def _pick_within_masks(logits: torch.Tensor, tokens: torch.Tensor, masks: FilledMasks, rows: list[int]) -> None:
        """Greedy rows whose argmax their grammar refuses: masked, and their argmax taken again."""
        wrong = refused(masks, rows, tokens)
        if wrong:
            apply_masks(logits, masks, wrong)
            index = torch.tensor(wrong, device=logits.device)
            tokens[index] = logits[index].argmax(dim=-1)

    def _sample_rows(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        device = logits.device
        params = [r.params for r in rows]
        temperature = torch.tensor([p.temperature for p in params], device=device).unsqueeze(1)
        logits = logits / temperature
        if any(p.top_k > 0 for p in params):
            logits = _top_k(logits, [p.top_k for p in params])
        if any(p.top_p < 1.0 for p in params):
            logits = _top_p(logits, torch.tensor([p.top_p for p in params], device=device))
        probs = torch.softmax(logits, dim=-1)
        if any(p.min_p > 0 for p in params):
            probs = _min_p(probs, torch.tensor([p.min_p for p in params], device=device))
        noise = torch.stack([self._noise(r.params.seed, r.position, probs.shape[1]) for r in rows])
        return (probs / noise).argmax(dim=-1)

    def _noise(self, seed: int | None, position: int, size: int) -> torch.Tensor:
        generator = self._generator
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(position_seed(seed, position))
        return torch.empty(size, device=self.device).exponential_(generator=generator)


def position_seed(seed: int, position: int) -> int:
    """A generator seed for a request's draw at output `position` (splitmix64 of both: neighbouring seeds
    and positions give unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def apply_bias_and_penalties(logits: torch.Tensor, shaping: list[int], rows: list[SampleRow]) -> None:
    """Logit bias, then the repetition penalty over prompt and output tokens (vLLM's and HF's: positive
    logits divided by it, negative ones multiplied), then frequency and presence penalties over the output
    tokens (OpenAI's: minus frequency x count, minus presence once), in place for the rows in `shaping`."""
    device, vocab = logits.device, logits.shape[1]
    for i in shaping:
        bias = rows[i].params.logit_bias
        if bias:
            ids = torch.tensor([t for t, _ in bias if t < vocab], device=device, dtype=torch.long)
            logits[i, ids] += torch.tensor([b for t, b in bias if t < vocab], device=device, dtype=logits.dtype)
    index = torch.tensor(shaping, device=device)
    shaped = logits[index]
    params = [rows[i].params for i in shaping]
    if any(p.repetition_penalty != 1 for p in params):
        seen = _presence(shaped, [list(rows[i].prompt_ids) + list(rows[i].output_ids) for i in shaping])
        penalty = torch.tensor([p.repetition_penalty for p in params], device=device).unsqueeze(1)
        scaled = torch.where(shaped > 0, shaped / penalty, shaped * penalty)
        shaped = torch.where(seen, scaled, shaped)
    if any(p.frequency_penalty != 0 or p.presence_penalty != 0 for p in params):
        counts = _counts(shaped, [rows[i].output_ids for i in shaping])
        frequency = torch.tensor([p.frequency_penalty for p in params], device=device).unsqueeze(1)
        presence = torch.tensor([p.presence_penalty for p in params], device=device).unsqueeze(1)
        shaped = shaped - frequency * counts - presence * (counts > 0)
    logits[index] = shaped


def _counts(logits: torch.Tensor, token_lists: list[Sequence[int]]) -> torch.Tensor:
    """[rows, vocab]: how often each token occurs in each row's list."""
    counts = torch.zeros_like(logits)
    for row, tokens in enumerate(token_lists):
        if tokens:
            ids = torch.tensor(list(tokens), device=logits.device, dtype=torch.long)
            counts[row].index_add_(0, ids, torch.ones(len(ids), device=logits.device, dtype=logits.dtype))
    return counts


def _presence(logits: torch.Tensor, token_lists: list[Sequence[int]]) -> torch.Tensor:
    return _counts(logits, token_lists) > 0


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


def _min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Zero the tokens under min_p x the row's top probability (the top token always stays)."""
    floor = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return probs.masked_fill(probs < floor, 0.0)
