"""One pool of KV pages for a model with sliding-window layers (vLLM's hybrid KV cache manager).

A sliding layer's query at position p reads only the keys in (p - window, p], so once a request has
computed c tokens its sliding layers never read a key before c - window + 1 again: their blocks there
can go back to the pool. The global layers keep every block. To hand back memory in units the pool
shares, layers are grouped: `lanes` = gcd(#global, #sliding) layers per group, every group of one kind,
and a page holds one block (block_size tokens) of K/V for each of a group's lanes. Each request has
one table of pages per group, position by position; a sliding group's leading entries become NULL
as its window passes. Gemma-3-270m (3 global and 15 sliding layers): 6 groups of 3 lanes; a request
of T tokens holds ceil(T/16) pages for the global group and at most ~window/16 + 1 for each sliding
one, instead of 6 x ceil(T/16).

A model without sliding layers has no KvGroups: one group of all its layers, one table (block_table),
pages = blocks, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.step_shape import WindowedShape

if TYPE_CHECKING:
    from engine.model_config import ModelConfig

NULL_PAGE = -1      # a sliding group's entry whose page went back to the pool


def window_shape(config: ModelConfig) -> WindowedShape | None:
    """What a step of this model attends to, where some of its layers attend to a window only."""
    return WindowedShape.of(config.layer_sliding, config.window)


@dataclass(frozen=True)
class KvGroups:
    lanes: int                                 # layers per group (= per page)
    layer_slots: tuple[tuple[int, int], ...]   # per layer: (group, lane)
    group_sliding: tuple[bool, ...]            # per group: whether its layers attend to a window
    window: int                                # keys a sliding layer's query sees, itself included
    block_size: int

    @staticmethod
    def of(layer_sliding: Sequence[bool], window: int | None, block_size: int) -> KvGroups | None:
        """The grouping for these layers (True: sliding); None without sliding layers."""
        sliding = [i for i, s in enumerate(layer_sliding) if s]
        full = [i for i, s in enumerate(layer_sliding) if not s]
        if not sliding or window is None:
            return None
        if not full:
            raise ValueError("a model whose every layer is sliding has no global group to key its prefix cache on")
        lanes = math.gcd(len(full), len(sliding))
        slots: dict[int, tuple[int, int]] = {}
        kinds = []
        for layers, is_sliding in ((full, False), (sliding, True)):   # global groups first: group 0 is global
            for k, layer in enumerate(layers):
                if k % lanes == 0:
                    kinds.append(is_sliding)
                slots[layer] = (len(kinds) - 1, k % lanes)
        return KvGroups(lanes, tuple(slots[i] for i in range(len(layer_sliding))), tuple(kinds), window, block_size)

    @staticmethod
    def for_model(config: ModelConfig, block_size: int) -> KvGroups | None:
        return KvGroups.of(config.layer_sliding, config.window, block_size)

    @property
    def num_groups(self) -> int:
        return len(self.group_sliding)

    @property
    def num_full(self) -> int:
        return self.group_sliding.count(False)

    @property
    def num_sliding(self) -> int:
        return self.group_sliding.count(True)

    def first_kept_block(self, computed: int) -> int:
        """With `computed` tokens done, a sliding group's blocks before this one hold only keys no later
        query reads (the next query, at position `computed`, reads from computed - window + 1 on)."""
        return max(0, computed - self.window + 1) // self.block_size

    def pages_for(self, computed: int, end: int) -> int:
        """Pages a request holds while it computes tokens [computed, end) (every group's blocks up to `end`,
        a sliding group's from first_kept_block(computed) on)."""
        blocks = -(-end // self.block_size)
        return self.num_full * blocks + self.num_sliding * max(0, blocks - self.first_kept_block(computed))

    def peak_pages(self, total: int, chunk: int) -> int:
        """The most pages a request of `total` tokens computed in chunks of at most `chunk` ever holds."""
        return self.pages_for(max(0, total - chunk), total)   # the last chunk: every global block, the widest span
