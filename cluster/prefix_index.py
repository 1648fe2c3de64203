"""Which replica probably holds which prompt prefix: the router's approximate view of the
replicas' prefix caches (SGLang's cache-aware router keeps a radix tree of the same).

Keys are the engine's own block keys (engine/kv_cache/prefix_cache.py: SHA-256 chained over 16-token
blocks from the cache salt's root), so a prefix matches here exactly when it would match in a
replica's pool. The index remembers where it sent each block, not what the replica still holds:
it is bounded (least recently used keys go first) and forgets a replica that restarted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.kv_cache.prefix_cache import block_key, root_key


def prompt_block_keys(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[bytes]:
    """The chained keys of the prompt's full blocks, as the replica's prefix cache computes them."""
    keys: list[bytes] = []
    parent = root_key(salt)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_key(parent, token_ids[start:start + block_size])
        keys.append(parent)
    return keys


class PrefixIndex:
    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._holders: OrderedDict[bytes, set[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._holders)

    def matched_blocks(self, keys: Sequence[bytes]) -> dict[str, int]:
        """Per replica, how many leading blocks of the prompt it was sent (0 omitted)."""
        matched: dict[str, int] = {}
        candidates: set[str] | None = None
        for i, key in enumerate(keys):
            holders = self._holders.get(key)
            candidates = set(holders or ()) if candidates is None else candidates & (holders or set())
            if not candidates:
                break
            for replica in candidates:
                matched[replica] = i + 1
        return matched

    def insert(self, replica: str, keys: Sequence[bytes]) -> None:
        holders = self._holders
        for key in keys:
            holders.setdefault(key, set()).add(replica)
            holders.move_to_end(key)
        while len(holders) > self.capacity:
            holders.popitem(last=False)

    def forget(self, replica: str) -> None:
        """The replica's cache is gone (it restarted): none of its blocks can be found any more."""
        for key in [k for k, holders in self._holders.items() if replica in holders]:
            holders = self._holders[key]
            holders.discard(replica)
            if not holders:
                del self._holders[key]
