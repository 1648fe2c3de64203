from __future__ import annotations

import pytest

from engine.kv_cache.block_manager import BlockManager, OutOfBlocksError


def test_allocate_grow_and_free_return_every_block():
    bm = BlockManager(8, 4)
    table: list[int] = []
    bm.grow(table, 1)
    assert len(table) == 1 and bm.num_free_blocks == 7
    bm.grow(table, 4)
    assert len(table) == 1
    bm.grow(table, 9)
    assert len(table) == 3 and bm.usage == pytest.approx(3 / 8)
    bm.free(table)
    assert bm.num_free_blocks == 8


def test_shared_blocks_are_freed_by_their_last_owner():
    bm = BlockManager(4, 2)
    blocks = bm.allocate(2)
    bm.share(blocks)
    bm.free(blocks)
    assert bm.num_free_blocks == 2
    bm.free(blocks)
    assert bm.num_free_blocks == 4
    with pytest.raises(ValueError, match="freed twice"):
        bm.free(blocks[:1])
    with pytest.raises(ValueError, match="cannot share a free block"):
        bm.share(blocks)


def test_out_of_blocks():
    bm = BlockManager(2, 2)
    bm.allocate(2)
    with pytest.raises(OutOfBlocksError):
        bm.allocate(1)
