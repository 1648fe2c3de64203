"""Shared by the attention backends' tests: step layouts with scattered KV blocks, whole generations."""

from __future__ import annotations

import numpy as np

from engine import SamplingParams
from engine.attention.batch_layout import BatchLayout
from tests.conftest import make_engine


def make_layout(context_lens: list[int], query_lens: list[int], num_decodes: int, block_size: int,
                rng: np.random.Generator) -> tuple[BatchLayout, int]:
    """Sequences with random, non-contiguous block ids drawn from one shuffled pool."""
    needs = [-(-(c + q) // block_size) for c, q in zip(context_lens, query_lens)]
    num_blocks = sum(needs) + 5
    ids = rng.permutation(num_blocks)
    tables, used = [], 0
    for n in needs:
        tables.append(ids[used:used + n].astype(np.int64))
        used += n
    layout = BatchLayout(num_decodes, np.array(query_lens, dtype=np.int64), np.array(context_lens, dtype=np.int64),
                         tables, block_size)
    return layout, num_blocks


def greedy_tokens_by_backend(path: str, backend: str, prompts: list[list[int]], max_tokens: int, **engine_args):
    """Greedy generations of the prompts under one attention backend, with a budget of 8 tokens so that
    prompts are chunked beside running decodes."""
    engine = make_engine(path, token_budget=8, attention_backend=backend, **engine_args)
    assert engine.runner.attention.name == backend
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
           for p in prompts]
    done = {}
    while engine.has_unfinished():
        done |= {out.request_id: out.token_ids for out in engine.step() if out.finished}
    return [done[i] for i in ids], engine
