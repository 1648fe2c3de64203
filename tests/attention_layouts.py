"""Step layouts for the attention backends' tests: sequences with scattered KV blocks."""

from __future__ import annotations

import numpy as np

from engine.batch_layout import BatchLayout


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
