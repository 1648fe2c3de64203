"""What one request's share of a step computes: the one place a step's shape is defined.

A request gets `n` new tokens on top of `c` already in its KV cache (a decode is n = 1). The
scheduler sums these into the step it records (engine.scheduling.scheduler.ScheduleResult), the deadline
policy into the step it prices before planning it (policies.deadline.StepTime), and calibration,
profile checks and the warm start into the steps they ask a cost model about. Plain functions of
ints: the scheduler calls them for every request every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def context_tokens(n: int, c: int) -> int:
    """Tokens the request's attention reads from the KV cache: its context and its new tokens."""
    return c + n


def attended_pairs(n: int, c: int) -> int:
    """(query, key) pairs its attention computes: new token i (1..n) sees the context and the chunk
    up to itself, c + i keys. A decode's pairs are its context read: attended_pairs(1, c) == c + 1."""
    return n * c + n * (n + 1) // 2


@dataclass(frozen=True)
class WindowedShape:
    """A model whose `share` of layers attend to the `window` keys up to each query (Gemma 3's sliding
    layers): their reads and pairs stop at the window, the rest as above. The step's figures are the
    layer-weighted mean, so a cost model's per-token and per-pair terms keep their meaning."""

    window: int
    share: float

    @staticmethod
    def of(layer_sliding: Sequence[bool], window: int | None) -> WindowedShape | None:
        """The shape of a model whose layers slide where True (None: none does, or no window)."""
        if window is None or not any(layer_sliding):
            return None
        return WindowedShape(window, sum(layer_sliding) / len(layer_sliding))

    def context_tokens(self, n: int, c: int) -> int:
        full = c + n
        return round((1 - self.share) * full + self.share * min(full, self.window - 1 + n))

    def attended_pairs(self, n: int, c: int) -> int:
        within = max(0, min(n, self.window - c))    # queries c + i <= window see c + i keys, the rest window
        windowed = within * c + within * (within + 1) // 2 + (n - within) * self.window
        return round((1 - self.share) * attended_pairs(n, c) + self.share * windowed)


def shape_functions(shape: WindowedShape | None):
    """(context_tokens, attended_pairs) for a model of this shape (None: every layer attends to all)."""
    return (shape.context_tokens, shape.attended_pairs) if shape else (context_tokens, attended_pairs)


def samples(n: int, c: int, num_tokens: int) -> bool:
    """Whether the chunk reaches the request's last known token (of `num_tokens`, prompt and outputs
    so far), so the step samples a new token for it."""
    return c + n == num_tokens


def head_rows(n: int, c: int, seq) -> int:
    """Rows the LM head computes for an `n`-token chunk of `seq` from position `c`: one if it samples,
    plus, for a request that scores its prompt (prompt logprobs), each prompt position the chunk covers
    whose next token is a prompt token (engine/logit_rows.py)."""
    rows = int(c + n == seq.num_tokens)
    if seq.scores_prompt:
        rows += max(0, min(c + n, seq.num_prompt_tokens - 1) - c)
    return rows
