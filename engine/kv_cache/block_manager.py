"""The KV block pool: fixed-size blocks handed out to requests, with reference counts.

Reference counts let blocks be shared (forks; engine/kv_cache/prefix_cache.py's pool shares cached prefixes);
a block returns to the free list when its count drops to zero. They are a plain list: the scheduler (and the simulator, ~200 blocks
per freed long request) touches them one block at a time, where numpy's scalar indexing costs ~10x.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from engine.kv_cache.kv_groups import NULL_PAGE, KvGroups

if TYPE_CHECKING:
    from engine.scheduling.request import Request

BLOCK_SIZE = 16   # tokens per KV block unless configured (vLLM's default too): the engine's, the simulator's, the router's


class OutOfBlocksError(RuntimeError):
    pass


class BlockManager:
    caching = False         # PrefixCachingBlockManager: blocks found by content

    def __init__(self, num_blocks: int, block_size: int, groups: KvGroups | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # a model with sliding-window layers: blocks are pages of layer groups (kv_groups.py); each request
        # holds block_table (group 0) and group_tables (the others)
        self.groups = groups
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

    def peak_blocks(self, num_tokens: int, chunk: int) -> int:
        """The most blocks one request of `num_tokens` tokens, computed in chunks of up to `chunk`, holds."""
        return self.groups.peak_pages(num_tokens, chunk) if self.groups else self.blocks_for(num_tokens)

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

    def exclusive_blocks(self, request: Request) -> int:
        """How many of the request's blocks freeing them would return to the pool (the others are shared)."""
        return len(request.block_table) + request.group_pages

    def grow(self, block_table: list[int], num_tokens: int) -> None:
        """Append blocks to `block_table` until it holds `num_tokens` tokens."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > 0:
            block_table.extend(self.allocate(missing))

    # -- a request's tables in every layer group (a model with sliding layers) --
    def grow_request(self, request: Request, num_tokens: int) -> None:
        """Blocks for `num_tokens` tokens in each of the request's tables."""
        self.grow(request.block_table, num_tokens)
        if self.groups is None:
            return
        if not request.group_tables:
            request.group_tables = [[] for _ in range(self.groups.num_groups - 1)]
        before = sum(map(len, request.group_tables))
        for table in request.group_tables:
            self.grow(table, num_tokens)
        request.group_pages += sum(map(len, request.group_tables)) - before

    def slide(self, request: Request) -> None:
        """Give back the sliding groups' blocks that the request's window has passed (after a step)."""
        groups = self.groups
        first = groups.first_kept_block(request.num_computed_tokens) if groups else 0
        if first <= request.slid_blocks:
            return
        for table, sliding in zip(request.group_tables, groups.group_sliding[1:]):
            if sliding:
                passed = [page for page in table[request.slid_blocks:first] if page != NULL_PAGE]
                self.free(passed)
                table[request.slid_blocks:first] = [NULL_PAGE] * (first - request.slid_blocks)
                request.group_pages -= len(passed)
        request.slid_blocks = first

    def trim(self, request: Request, num_tokens: int) -> None:
        """Give back the blocks past those holding the request's first `num_tokens` tokens (the KV of drafted
        tokens its verification rejected)."""
        keep = self.blocks_for(num_tokens)
        if len(request.block_table) > keep:
            self.free(request.block_table[keep:])
            del request.block_table[keep:]
        for table in request.group_tables:
            if len(table) > keep:
                tail = [page for page in table[keep:] if page != NULL_PAGE]
                self.free(tail)
                del table[keep:]
                request.group_pages -= len(tail)

    def release(self, request: Request) -> None:
        """Every block of the request back to the pool."""
        self.free(request.block_table)
        for table in request.group_tables:
            self.free([page for page in table if page != NULL_PAGE])
        request.block_table, request.group_tables, request.group_pages, request.slid_blocks = [], [], 0, 0
