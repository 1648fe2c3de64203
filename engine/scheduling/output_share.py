"""How much of its output limit a request uses, learned from those that finished.

The deadline policy keeps this share of the running requests' remaining `max_tokens` free in the KV
pool when it starts a new request (policies/kv_reserve.py): a running request that needs a block the
pool no longer has preempts the newest one, which recomputes and whose next token comes seconds late,
a TBT miss. Requests sent with `ignore_eos` or run to their limit use all of it, chat clients that stop
at EOS far less of a large `max_tokens`; a fixed ratio (SGLang's `new_token_ratio`) is right for one
of them only. The share is the 90th percentile over the last FINISHED_KEPT requests that finished on
their own (stop or length), 0 (nothing kept) until MIN_FINISHED have.
"""

from __future__ import annotations

from collections import deque

import numpy as np

SHARE_QUANTILE = 0.9
FINISHED_KEPT = 200
MIN_FINISHED = 20


class OutputShare:
    def __init__(self) -> None:
        self._shares: deque[float] = deque(maxlen=FINISHED_KEPT)
        self.value = 0.0

    def observe(self, num_output_tokens: int, max_tokens: int) -> None:
        """A request finished on its own with this many output tokens of its limit."""
        if max_tokens <= 0:
            return
        self._shares.append(min(1.0, num_output_tokens / max_tokens))
        if len(self._shares) >= MIN_FINISHED:
            self.value = float(np.quantile(self._shares, SHARE_QUANTILE))
