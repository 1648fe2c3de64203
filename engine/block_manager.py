"""The KV block pool: fixed-size blocks handed out to requests, with reference counts.

Reference counts let blocks be shared (prefix caching, forks); a block returns to the free list
when its count drops to zero.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class OutOfBlocksError(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = np.zeros(num_blocks, dtype=np.int32)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocksError(f"asked for {count} KV blocks, {len(self._free)} free")
        blocks = [self._free.popleft() for _ in range(count)]
        self._ref_counts[blocks] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        """Another owner holds these blocks too."""
        if blocks and (self._ref_counts[blocks] < 1).any():
            raise ValueError("cannot share a free block")
        self._ref_counts[blocks] += 1

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            if self._ref_counts[block] < 1:
                raise ValueError(f"block {block} freed twice")
            self._ref_counts[block] -= 1
            if self._ref_counts[block] == 0:
                self._free.append(block)

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to `block_table` until it holds `num_tokens` tokens."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > 0:
            block_table.extend(self.allocate(missing))
