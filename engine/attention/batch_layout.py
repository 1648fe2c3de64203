"""The flattened layout of one step: which tokens belong to which sequence and where their KV lives.

Decode sequences (one query token each) come first, then prefill chunks. Built once per step with
numpy and shared by every layer; attention backends derive their own metadata from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchLayout:
    num_decodes: int
    query_lens: np.ndarray        # [seqs] tokens computed this step per sequence
    context_lens: np.ndarray      # [seqs] tokens already in the KV cache before this step
    block_tables: list[np.ndarray]  # per sequence, its KV block ids (covering context + query)
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.query_lens.sum())

    @property
    def query_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.query_lens)[:-1]]).astype(np.int64)

    @property
    def seq_lens(self) -> np.ndarray:
        """Tokens each sequence attends to after this step: cached context plus its new tokens."""
        return self.context_lens + self.query_lens

    def slots(self, seq: int, start: int, end: int) -> np.ndarray:
        """Flat KV-cache slot of each position in [start, end) of sequence `seq`."""
        positions = np.arange(start, end)
        return self.block_tables[seq][positions // self.block_size] * self.block_size + positions % self.block_size

    def positions(self) -> np.ndarray:
        return np.concatenate([np.arange(c, c + q) for c, q in zip(self.context_lens, self.query_lens)])

    def slot_mapping(self) -> np.ndarray:
        """Where each new token's K and V are written."""
        return np.concatenate([self.slots(i, c, c + q) for i, (c, q) in
                               enumerate(zip(self.context_lens, self.query_lens))])
