"""The KV block pool: fixed-size blocks handed out to requests, with reference counts.

Reference counts let blocks be shared (forks; engine/kv_cache/prefix_cache.py's pool shares cached prefixes);
a block returns to the free list when its count drops to zero. They are a plain list: the scheduler (and the simulator, ~200 blocks
per freed long request) touches them one block at a time, where numpy's scalar indexing costs ~10x.
"""

from __future__ import annotations

from collections import deque

BLOCK_SIZE = 16   # tokens per KV block unless configured (vLLM's default too): the engine's, the simulator's, the router's


class OutOfBlocksError(RuntimeError):
    pass


class BlockManager:
    caching = False         # PrefixCachingBlockManager: blocks found by content

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._ref_counts = [0] * num_blocks

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
        counts = self._ref_counts
        for block in blocks:
            counts[block] = 1
        return blocks

    def share(self, blocks: list[int]) -> None:
        """Another owner holds these blocks too."""
        counts = self._ref_counts
        if any(counts[block] < 1 for block in blocks):
            raise ValueError("cannot share a free block")
        for block in blocks:
            counts[block] += 1

    def free(self, blocks: list[int]) -> None:
        counts = self._ref_counts
        for block in blocks:
            count = counts[block]
            if count < 1:
                raise ValueError(f"block {block} freed twice")
            counts[block] = count - 1
            if count == 1:
                self._free.append(block)

    def exclusive_blocks(self, block_table: list[int]) -> int:
        """How many of these blocks freeing them would return to the pool (the others are shared)."""
        return len(block_table)

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to `block_table` until it holds `num_tokens` tokens."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > 0:
            block_table.extend(self.allocate(missing))
