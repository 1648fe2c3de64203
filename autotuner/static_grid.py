"""Each policy's coarse grid of static configurations: what `tune --simulate` compares the tuner
with (the best of them in hindsight), and the first points the warm start simulates."""

from __future__ import annotations

import itertools
from typing import Any

STATIC_BUDGETS = (32, 64, 128, 256, 512, 1024, 2048)
STATIC_PRIORITIES = (0.0, 0.5, 1.0)
# the deadline policy's own grid: the budget is only a cap there, the step time follows the slack
DEADLINE_GRID = {"token_budget": (256, 2048), "step_headroom": (0.8, 1.0), "error_budget": (0.0, 0.5, 1.0)}
# speculative decoding's settings, tried on the grid's best point where a run has a drafter: off, every
# decode verifying a fixed length, and the step loop's priced choice at two caps
FIXED_DRAFTS = (2, 4, 8)
ADAPTIVE_CAPS = (8, 16)


def grid_points(policy: str) -> list[dict[str, Any]]:
    """The offline grid of static configurations for a policy."""
    base = {"max_num_seqs": 256, "kv_admission_watermark": 0.01}
    if policy == "deadline":
        names = list(DEADLINE_GRID)
        return [base | dict(zip(names, values)) for values in itertools.product(*DEADLINE_GRID.values())]
    return [base | {"token_budget": b, "prefill_priority": p}
            for b, p in itertools.product(STATIC_BUDGETS, STATIC_PRIORITIES)]


def speculation_points() -> list[dict[str, Any]]:
    """The speculation settings a static grid tries, off first."""
    return [{"speculative_tokens": 0},
            *({"speculative_tokens": k, "speculative_mode": "fixed"} for k in FIXED_DRAFTS),
            *({"speculative_tokens": k, "speculative_mode": "adaptive"} for k in ADAPTIVE_CAPS)]
