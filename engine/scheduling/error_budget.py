"""The TBT percentile as an error budget: P99 TBT tolerates 1% of token gaps over the target.

Counted over a sliding horizon from the gaps that actually happened (so a step that ran long by
the cost model's error, or by a policy's choice, spends it alike): each gap adds
(1 - percentile/100) of a tolerated long gap, each gap over its request's TBT target one long gap.
The deadline policy spends what is left on prompts whose TTFT is at risk, never more.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.scheduling.request import Request

# The default for an engine used alone (the offline LLM API, a plain simulation, tests). The daemon and
# the tuner's simulations pass the controller's context_window_s instead (serving/daemon.py,
# simulation.workload_run.make_simulator), the horizon its windows' P99 is read on.
HORIZON_S = 60.0


class ErrorBudget:
    def __init__(self, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = horizon_s
        self._steps: deque[tuple[float, float, int]] = deque()   # (time, tolerated, long) per step
        self.tolerated = 0.0
        self.long = 0

    def observe(self, sampling: Iterable[Request], now: float) -> None:
        """Before the step's tokens are appended: each request's gap since its previous token."""
        tolerated, long = 0.0, 0
        for request in sampling:
            times = request.timings.token_times       # request.last_token_time, inlined: every request, every step
            if not times:
                continue                               # a first token: TTFT, not a gap
            tolerated += request.tbt_tolerance
            is_long = now - times[-1] > request.tbt_target_s
            request.long_gaps += is_long
            long += is_long
        self.add(now, tolerated, long)

    def add(self, now: float, tolerated: float, long: int) -> None:
        if tolerated or long:
            self._steps.append((now, tolerated, long))
            self.tolerated += tolerated
            self.long += long
        self._trim(now)

    def state(self, now: float) -> tuple[float, int]:
        """(tolerated, long) gaps over the horizon ending now."""
        self._trim(now)
        return max(0.0, self.tolerated), self.long

    def _trim(self, now: float) -> None:
        horizon = now - self.horizon_s
        steps = self._steps
        while steps and steps[0][0] < horizon:
            _, tolerated, long = steps.popleft()
            self.tolerated -= tolerated
            self.long -= long
