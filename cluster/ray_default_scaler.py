"""Ray Serve's default autoscaling policy, re-stated without Ray so the fleet simulator can run it
as the baseline (ray/serve/autoscaling_policy.py of Ray 2.60: replica_queue_length_autoscaling_policy
and _apply_delay_logic; tests/test_fleet_planner.py checks it against Ray's own code where Ray is
installed).

    ongoing = total requests queued and running at the replicas, averaged over look_back_period_s
    desired = ceil(ongoing / target_ongoing_requests), within min/max replicas
    more than now: applied once wanted for upscale_delay_s (30 s); fewer: after downscale_delay_s
    (600 s); any other decision in between restarts the wait
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from cluster.fleet_telemetry import FleetTelemetry

CONTROL_LOOP_PERIOD_S = 0.1      # ray.serve._private.constants: how often the controller decides


@dataclass(frozen=True)
class RayDefaultConfig:
    target_ongoing_requests: float = 2.0
    min_replicas: int = 1
    max_replicas: int = 8
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    look_back_period_s: float = 30.0

    def __post_init__(self) -> None:
        if not (self.target_ongoing_requests > 0 and 1 <= self.min_replicas <= self.max_replicas):
            raise ValueError("ray default: need target_ongoing_requests > 0 and 1 <= min_replicas <= max_replicas")


class RayDefaultScaler:
    def __init__(self, config: RayDefaultConfig, initial_replicas: int | None = None,
                 interval_s: float = 1.0) -> None:
        self.config = config
        self.interval_s = interval_s          # decisions this often (Ray's loop is 0.1 s; the delays dominate)
        self.initial_replicas = initial_replicas or config.min_replicas
        self.current = self.initial_replicas
        self._samples: deque[tuple[float, int]] = deque()
        self._since: float | None = None      # when the current direction was first wanted
        self._direction = 0

    def observe(self, now: float, ongoing: int) -> None:
        self._samples.append((now, ongoing))
        while self._samples and self._samples[0][0] < now - self.config.look_back_period_s:
            self._samples.popleft()

    def desired(self) -> int:
        c = self.config
        if not self._samples:
            return self.current
        ongoing = sum(n for _, n in self._samples) / len(self._samples)
        return min(max(math.ceil(ongoing / c.target_ongoing_requests), c.min_replicas), c.max_replicas)

    def decide(self, telemetry: FleetTelemetry | None, now: float) -> int:
        desired = self.desired()
        direction = (desired > self.current) - (desired < self.current)
        if direction == 0:
            self._since, self._direction = None, 0
            return self.current
        if direction != self._direction or self._since is None:
            self._since, self._direction = now, direction
        delay = self.config.upscale_delay_s if direction > 0 else self.config.downscale_delay_s
        if now - self._since + 1e-3 >= delay:
            self.current = desired
            self._since, self._direction = None, 0
        return self.current
