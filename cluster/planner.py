"""The SLO planner: every interval, the fleet's telemetry in, a replica count out (pure: no Ray;
cluster/planner_service.py runs it in the ingress, cluster/fleet_run.py in the fleet simulator).

    forecast = forecaster(the past intervals' arrival rates, horizon = start-up + interval)
               + the requests now waiting for a first token / backlog_drain_s (a burst's queue: the
               replicas holding it serve nothing new until it drains, so new arrivals need others)
    per replica = capacity of the observed mix (prompt/output lengths, prefix hit rate),
                  its prefill and decode parts scaled by observed/profiled TTFT and TPOT
                  (read only in settled intervals within the SLO target, see below; the last
                  such interval's meanwhile: a backlog's latencies would shrink the capacity too)
    wanted = ceil(forecast x (1 + headroom) / per replica), + 1 if the interval missed the SLO target
             and the last scale-up has served a whole interval (nothing starting, startup_s +
             interval_s since it was asked for): misses seen before it are the backlog it answers
    target = wanted when it is more than now (at once); else the most wanted over the last
             scale_down_delay_s (Kubernetes HPA's stabilization window: the fleet steps down as the
             load's recent peak passes, one plan at a time); within min/max replicas
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from cluster.fleet_sizing import latency_factors, replicas_for
from cluster.fleet_telemetry import FleetTelemetry
from cluster.forecast import forecast
from cluster.planner_config import PlannerConfig
from cluster.replica_capacity import ReplicaCapacity

HISTORY = 240        # intervals of rates the forecaster sees


@dataclass(frozen=True)
class PlanDecision:
    target: int                 # replicas (serving + starting) wanted from now on
    wanted: int                 # what the load asked for before hysteresis and bounds
    forecast_rps: float         # arrivals' forecast + the backlog's drain rate
    backlog_rps: float          # the latter
    per_replica_rps: float
    prefill_factor: float
    decode_factor: float
    reason: str                 # up | down | hold | slo (attainment below target) | bounds


class Planner:
    def __init__(self, config: PlannerConfig, capacity: ReplicaCapacity) -> None:
        self.config, self.capacity = config, capacity
        self.rates: deque[float] = deque(maxlen=HISTORY)
        self.current = config.min_replicas
        self._wants: deque[tuple[float, int]] = deque()   # (time, wanted) over the scale-down delay
        self._last_up: float | None = None        # when it last asked for more replicas
        self._factors = (1.0, 1.0)                # the latency factors of the last settled interval

    def decide(self, telemetry: FleetTelemetry, now: float) -> PlanDecision:
        c = self.config
        self.rates.append(telemetry.rate_rps)
        arrivals = forecast(self.rates, c.forecaster, c.alpha, c.beta, c.horizon_intervals)
        settled = self._settled(telemetry, now)
        within = telemetry.attainment is None or telemetry.attainment >= c.slo_target
        if settled and within:      # else its latencies are a backlog's (the guard below answers a miss)
            self._factors = latency_factors(telemetry, self.capacity, c)
        prefill, decode = self._factors
        prompt = telemetry.prompt_tokens or self.capacity.prompt_tokens
        output = telemetry.output_tokens or self.capacity.output_tokens
        per_replica = self.capacity.rate_for(prompt, output, telemetry.cached_fraction, prefill, decode)
        backlog = telemetry.queued_tokens / (prompt + output) / c.backlog_drain_s
        predicted = arrivals + backlog
        wanted = replicas_for(predicted, per_replica, c.headroom)
        missed = telemetry.attainment is not None and telemetry.finished >= c.min_samples \
            and telemetry.attainment < c.slo_target and settled
        if missed:
            wanted = max(wanted, telemetry.serving + telemetry.starting + 1)
        target, reason = self._hysteresis(wanted, now)
        bounded = min(max(target, c.min_replicas), c.max_replicas)
        if missed and target > self.current:
            reason = "slo"
        if bounded != target:
            reason = "bounds"
        if bounded > self.current:
            self._last_up = now
        self.current = bounded
        return PlanDecision(bounded, wanted, predicted, backlog, per_replica, prefill, decode, reason)

    def _settled(self, telemetry: FleetTelemetry, now: float) -> bool:
        """Whether the last scale-up has served a whole interval: no replica is loading and
        startup_s + interval_s have passed since it was asked for. Until then the requests that
        miss are those that queued before it, and adding a replica per such interval would
        stack replicas on one backlog (with intervals shorter than the start-up, one per interval)."""
        c = self.config
        return telemetry.starting == 0 and (self._last_up is None or now - self._last_up >= c.startup_s + c.interval_s)

    def _hysteresis(self, wanted: int, now: float) -> tuple[int, str]:
        """Up at once; down to the most wanted within the last scale_down_delay_s, so a replica
        leaves only once the load has wanted fewer for that long, and the fleet follows a falling
        load with that lag (not in steps of a whole delay each)."""
        self._wants.append((now, wanted))
        while self._wants[0][0] < now - self.config.scale_down_delay_s:
            self._wants.popleft()
        if wanted >= self.current:
            return wanted, "up" if wanted > self.current else "hold"
        target = min(max(w for _, w in self._wants), self.current)
        return target, "down" if target < self.current else "hold"
