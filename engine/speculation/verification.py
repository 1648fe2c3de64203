"""Verifying drafted tokens in the step's forward pass, and what is kept.

A decode verifying d drafted tokens runs as d + 1 decode rows of the same sequence: row j feeds the
token at position c + j (the last known token, then the drafts) and attends to the c + j + 1 keys up to
itself through the request's block table. Every layer writes the step's keys and values before any row
attends (both CPU paths and the GPU kernels), so the rows see exactly the causal prefix a chunk would,
and a step of verifying decodes stays a decode step (the C decode layer, the quantized kernels, CUDA
graphs). Each row is sampled as the position it is, with the sampler's usual order; drafted token j + 1
is kept while it equals row j's sample, and the sample of the first row whose draft differs (or of the
last row) follows the kept drafts. Every emitted token is thus the target model's own sample given the
tokens before it: greedy outputs are those of plain decoding, and sampled ones follow its distribution
exactly (with a seed, the very same tokens: the sampler's draws are keyed by position)."""

from __future__ import annotations

from engine.scheduling.scheduler import ScheduledRequest


def layout_rows(scheduled: list[ScheduledRequest]) -> tuple[list[ScheduledRequest], list[int]]:
    """The step's sequences as the forward pass lays them out (a verifying decode as its decode rows), and
    the indices of the rows that sample, in the step's order."""
    if not any(s.num_drafts for s in scheduled):
        return scheduled, [i for i, s in enumerate(scheduled) if s.samples]
    rows: list[ScheduledRequest] = []
    sampling: list[int] = []
    for s in scheduled:
        if s.num_drafts:
            for j in range(s.num_drafts + 1):
                sampling.append(len(rows))
                rows.append(ScheduledRequest(s.request, 1, s.context_len + j))
            continue
        if s.samples:
            sampling.append(len(rows))
        rows.append(s)
    return rows, sampling


def kept_drafts(drafts: list[int], sampled: list[int]) -> int:
    """How many leading drafted tokens match the samples of the rows before them."""
    kept = 0
    while kept < len(drafts) and drafts[kept] == sampled[kept]:
        kept += 1
    return kept
