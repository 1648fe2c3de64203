"""Automatic prefix caching: KV blocks found by their content (vLLM V1's KVCacheManager/BlockPool).

A full block's key is a SHA-256 chained over its tokens and its prefix block's key, starting from
the request's cache salt, so equal keys mean equal tokens at equal positions after an equal
prefix: equal K/V. (The model, dtype and block size are fixed for a pool's life, so they need no
place in the key.) SHA-256 rather than Python's hash: a tenant must not be able to craft a
collision with another's blocks (vLLM's CVE-2025-25183).

A waiting request is probed each step (no reference taken): its leading full blocks found in the
pool count as computed, so policies and the cost model see only the uncached tokens as prefill.
A probe's answer is kept until one of the keys it looked at changes (cached, evicted, taken from
or given back to the free queue): an overloaded server's queue of thousands, all sharing a system
prompt, would otherwise walk that prompt's blocks once per request every step.
Admission takes references on them; blocks become findable once computed (at commit). Freed
blocks with content stay cached in the free queue, least recently freed first to be reused, so
they are evicted only when the pool needs them; blocks without content go to its front.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.kv_cache.block_manager import BlockManager, OutOfBlocksError
from engine.kv_cache.kv_groups import NULL_PAGE, KvGroups

if TYPE_CHECKING:
    from engine.scheduling.request import Request

NO_SALT_ROOT = hashlib.sha256(b"autotuned-serve prefix cache v1").digest()


def root_key(salt: str | None) -> bytes:
    """The chain's start: per tenant when a salt is given."""
    if salt is None:
        return NO_SALT_ROOT
    return hashlib.sha256(NO_SALT_ROOT + b"salt:" + salt.encode()).digest()


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


def group_key(key: bytes, group: int) -> bytes:
    """A block's key in layer group `group`: group 0's is the key itself, as without groups."""
    return key + bytes([group]) if group else key


@dataclass(eq=False)   # hashed by identity: a pool's watchers are sets of states
class PrefixState:
    """A request's prefix-cache bookkeeping."""

    keys: list[bytes] = field(default_factory=list)   # chained keys of its first full blocks, computed as needed
    hits: list[int] = field(default_factory=list)     # waiting: cached blocks of its prefix at the last probe
    group_hits: list[list[int]] = field(default_factory=list)   # ... in layer groups 1.. (sliding: the window's)
    held_hits: int = 0          # waiting: how many of those other requests hold (they cost no free block)
    stale: bool = True          # waiting: a key the last probe looked at has changed since
    watched: list[bytes] = field(default_factory=list)   # waiting: those keys
    registered: int = 0         # running: leading blocks of its table already cached (or duplicates)
    cached_tokens: int = 0      # prompt tokens its first admission found cached

    def forget_blocks(self) -> None:
        """Its blocks were freed (preempted, finished): probe again from scratch."""
        self.hits, self.group_hits, self.held_hits, self.stale, self.registered = [], [], 0, True, 0


@dataclass
class CacheStats:
    """Cumulative, in tokens as vLLM's prefix_cache_queries/hits: first admissions only, since a
    preempted request finding its own blocks again says nothing about the workload."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0          # cached blocks reused for other content


class PrefixCachingBlockManager(BlockManager):
    caching = True

    def __init__(self, num_blocks: int, block_size: int, groups: KvGroups | None = None) -> None:
        super().__init__(num_blocks, block_size, groups)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))   # type: ignore[assignment]
        self._key_of: list[bytes | None] = [None] * num_blocks
        self._by_key: dict[bytes, int] = {}
        self._watchers: dict[bytes, set[PrefixState]] = {}   # key -> waiting requests whose probe looked at it
        self.stats = CacheStats()

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_key)

    # -- the pool --
    def allocate(self, count: int) -> list[int]:
        free = self._free
        if count > len(free):
            raise OutOfBlocksError(f"asked for {count} KV blocks, {len(free)} free")
        blocks = [free.popitem(last=False)[0] for _ in range(count)]
        for block in blocks:
            if self._key_of[block] is not None:
                self._evict(block)
            self._ref_counts[block] = 1
        return blocks

    def free(self, blocks: list[int]) -> None:
        counts, free, key_of = self._ref_counts, self._free, self._key_of
        for block in reversed(blocks):   # a request's tail first: its prefix, likelier shared, is evicted last
            count = counts[block]
            if count < 1:
                raise ValueError(f"block {block} freed twice")
            counts[block] = count - 1
            if count == 1:
                free[block] = None
                if key_of[block] is None:
                    free.move_to_end(block, last=False)   # nothing worth keeping: reused first
                else:
                    self._changed(key_of[block])           # no longer held: a probe finding it must take it

    def exclusive_blocks(self, request: Request) -> int:
        counts = self._ref_counts
        tables = [request.block_table, *request.group_tables]
        return sum(1 for table in tables for block in table if block != NULL_PAGE and counts[block] == 1)

    def _evict(self, block: int) -> None:
        key = self._key_of[block]
        self._changed(key)
        del self._by_key[key]
        self._key_of[block] = None
        self.stats.evictions += 1

    # -- which waiting requests must probe again --
    def _changed(self, key: bytes) -> None:
        """`key` was cached, evicted, taken or freed: the probes that looked at it are stale."""
        for state in self._watchers.pop(key, ()):
            state.stale = True

    def _watch(self, state: PrefixState, keys: list[bytes]) -> None:
        self._unwatch(state)
        watchers = self._watchers
        for key in keys:
            watchers.setdefault(key, set()).add(state)
        state.watched, state.stale = keys, False

    def _unwatch(self, state: PrefixState) -> None:
        watchers = self._watchers
        for key in state.watched:
            states = watchers.get(key)
            if states is not None:
                states.discard(state)
                if not states:
                    del watchers[key]
        state.watched = []

    # -- requests --
    def probe(self, request: Request) -> None:
        """A waiting request's cached prefix: its leading full blocks found in the pool, never
        reaching its last token (that one must be computed to sample from)."""
        state = request.cache
        if not state.stale:
            return
        limit = (request.num_tokens - 1) // self.block_size if request.cacheable else 0
        hits: list[int] = []
        looked_at: list[bytes] = []     # the keys whose change can change this answer: each one looked up, ...
        by_key = self._by_key
        for i in range(limit):
            key = self._key(request, i)
            looked_at.append(key)
            block = by_key.get(key)
            if block is None:
                break
            hits.append(block)
        group_hits: list[list[int]] = []
        if self.groups is not None:
            looked_at += [group_key(self._key(request, i), g) for g in range(1, self.groups.num_groups)
                          for i in range(len(hits))]
            hits, group_hits = self._group_hits(request, hits)
        self._watch(state, looked_at)   # ... and the hits' keys, whose blocks' holders count too
        counts = self._ref_counts
        state.hits, state.group_hits = hits, group_hits
        state.held_hits = sum(1 for table in (hits, *group_hits) for block in table
                              if block != NULL_PAGE and counts[block] > 0)
        request.num_computed_tokens = len(hits) * self.block_size

    def _group_hits(self, request: Request, hits: list[int]) -> tuple[list[int], list[list[int]]]:
        """The longest prefix of `hits` (group 0's) whose blocks every other group has cached too: a global
        group all of them, a sliding group those of the window the next query reads. Returns group 0's hits
        and, per other group, its hit pages (a sliding group's from its first kept block on)."""
        groups, by_key = self.groups, self._by_key
        found = [[by_key.get(group_key(self._key(request, i), g)) for i in range(len(hits))]
                 for g in range(1, groups.num_groups)]
        for n in range(len(hits), 0, -1):
            first = groups.first_kept_block(n * self.block_size)
            tables = [column[first if sliding else 0:n]
                      for column, sliding in zip(found, groups.group_sliding[1:])]
            if all(None not in table for table in tables):
                return hits[:n], [t if not s else [NULL_PAGE] * first + t
                                  for t, s in zip(tables, groups.group_sliding[1:])]
        return [], []

    def acquire(self, request: Request) -> None:
        """On admission: take the probed blocks. The step that admits a request evicts nothing
        before this, so the probe still holds."""
        state, counts, free = request.cache, self._ref_counts, self._free
        self._unwatch(state)
        for block in (b for table in (state.hits, *state.group_hits) for b in table if b != NULL_PAGE):
            if counts[block] == 0:
                del free[block]
                self._changed(self._key_of[block])   # now held: a probe finding it costs no free block
            counts[block] += 1
        request.block_table = list(state.hits)
        if state.group_hits:
            request.group_tables = [list(t) for t in state.group_hits]
            request.group_pages = sum(1 for t in state.group_hits for b in t if b != NULL_PAGE)
            request.slid_blocks = self.groups.first_kept_block(len(state.hits) * self.block_size)
        num_cached = len(state.hits) * self.block_size
        if request.num_computed_tokens != num_cached:
            raise RuntimeError(f"request {request.request_id} admitted with a stale prefix probe")
        if request.num_preemptions == 0:
            state.cached_tokens = num_cached
            self.stats.queries += request.num_tokens
            self.stats.hits += num_cached
        state.registered, state.hits, state.group_hits, state.held_hits = len(state.hits), [], [], 0

    def release(self, request: Request) -> None:
        self._unwatch(request.cache)   # a waiting request aborted: its probe is no one's concern now
        super().release(request)

    def register(self, request: Request) -> None:
        """After a step: the request's newly computed full blocks become findable. A block whose
        content is cached already (two requests computed it at once) stays private."""
        state = request.cache
        full = request.num_computed_tokens // self.block_size
        if full <= state.registered or not request.cacheable:
            return
        by_key, key_of = self._by_key, self._key_of
        tables = [request.block_table, *request.group_tables]
        for i in range(state.registered, full):
            base = self._key(request, i)
            for g, table in enumerate(tables):
                key = group_key(base, g)
                page = table[i]
                if page != NULL_PAGE and key not in by_key:
                    by_key[key] = page
                    key_of[page] = key
                    self._changed(key)
        state.registered = full

    def _key(self, request: Request, i: int) -> bytes:
        """The key of the request's i-th block (the chain computed up to it first)."""
        keys = request.cache.keys
        while len(keys) <= i:
            j = len(keys)
            parent = keys[-1] if keys else root_key(request.cache_salt)
            keys.append(block_key(parent, request.token_ids(j * self.block_size, (j + 1) * self.block_size)))
        return keys[i]

    def check(self) -> None:
        """Consistency of the pool (tests): free blocks unreferenced, keys and blocks one to one."""
        assert all(self._ref_counts[b] == 0 for b in self._free)
        assert all(self._key_of[b] == k for k, b in self._by_key.items())
        assert sum(k is not None for k in self._key_of) == len(self._by_key)
