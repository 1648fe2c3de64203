"""A fast stand-in for one simulated replica in a fleet day: a queue of work in deadline order
instead of the real scheduler step by step, so a day of real length (millions of requests)
replays in minutes where the step-level fleet (simulation/fleet.py over simulation/simulator.py)
takes hours.

Prompts wait their turn, the most urgent first (the deadline policy's order: arrival + the class's
TTFT target), and each takes its tokens at the step-time model's full prefill rate (a 2048-token
chunk) in the share of the replica's time that decoding leaves; decoding takes `decode_share` of it
at the profiled capacity, proportionally less or more at the replica's recent arrival rate. A
request's first token comes no sooner than the profile's lone-request TTFT (scaled by its prompt)
after its turn begins; it then decodes at the profile's time per output token for that load.
`decode_share` is fitted (`fit_queue_model`) so that a lone replica of this model keeps exactly the
profile's SLO target at the profiled capacity, on the profile's own probe requests.

What it leaves out: step-level effects (a long prompt's chunks slowing others' decodes, decode gaps
stretched toward the TBT target to drain a queue, KV preemption) and prefix caching;
benchmarks/fleet_model_check.py runs both replica models on the same fleet days (docs/cluster.md).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cluster.capacity_profile import probe_requests
from cluster.replica_capacity import ReplicaCapacity
from engine.outputs import RequestRecord
from engine.slo_class import SloClasses, shipped_slo_classes
from loadgen.workload import Workload
from simulation.simulator import EngineLoad, RequestLike
from telemetry.window import meets_slo

LOAD_TIME_CONSTANT_S = 30.0      # the recent arrival rate the decode share and speed follow
MAX_LOAD = 1.5                   # the decode share grows with the load up to this (x capacity); past it prompts queue
MIN_PREFILL_SHARE = 0.05         # prefill never starves entirely


@dataclass(frozen=True)
class QueueModel:
    capacity: ReplicaCapacity
    decode_share: float         # of the replica's time at the profiled capacity, what decoding takes (fitted)
    slo_classes: SloClasses

    def __post_init__(self) -> None:
        if not 0 <= self.decode_share < 1 or not self.capacity.latency:
            raise ValueError("queue model: needs 0 <= decode_share < 1 and a capacity profile with latencies")

    def prefill_s(self, item: RequestLike, utilization: float) -> float:
        """The replica's time for the request's prompt: at the full prefill rate (a large chunk), in
        the time decoding leaves at this load (the decode share grows with it, up to MAX_LOAD)."""
        share = self.decode_share * min(max(utilization, 0.0), MAX_LOAD)
        return item.prompt_tokens * self.capacity.prefill_token_s / max(1.0 - share, MIN_PREFILL_SHARE)

    def lone_ttft_s(self, item: RequestLike) -> float:
        """A lone request's TTFT: the profile's at its lowest load, scaled by the prompt's length."""
        return self.capacity.latency[0].ttft_s * item.prompt_tokens / self.capacity.prompt_tokens

    def tpot_s(self, utilization: float) -> float:
        predicted = self.capacity.predicted(utilization)
        assert predicted is not None       # __post_init__: the profile has latencies
        return predicted[1]


class QueueReplica:
    """The interface of simulation.simulator.Simulator that the fleet uses: submit, run_until,
    done, load, kv_usage, finish_listeners, num_rejected, now."""

    def __init__(self, model: QueueModel) -> None:
        self.model = model
        self.now = 0.0
        self.finish_listeners: list[Callable[[RequestRecord], None]] = []
        self.num_rejected = 0
        self._arrivals: list[RequestLike] = []                              # submitted, in arrival order
        self._next_arrival = 0
        self._waiting: list[tuple[float, int, RequestLike]] = []           # (deadline, seq, item): a heap
        self._running: list[tuple[float, int, RequestRecord]] = []         # (finish, seq, record): a heap
        self._free_at = 0.0                 # when the replica's work on the request in turn ends
        self._seq = 0
        self._queued_tokens = self._running_tokens = 0
        self._rate = 0.0                    # recent arrivals/s (exponentially weighted)
        self._rate_t = 0.0

    def submit(self, items: Iterable[RequestLike]) -> None:
        self._arrivals.extend(sorted(items, key=lambda r: r.arrival_s))

    @property
    def done(self) -> bool:
        return self._next_arrival == len(self._arrivals) and not self._waiting and not self._running

    @property
    def load(self) -> EngineLoad:
        pending = self._arrivals[self._next_arrival:]
        queued = self._queued_tokens + sum(p.prompt_tokens + p.output_tokens for p in pending)
        return EngineLoad(queued, self._running_tokens, len(self._waiting) + len(self._running) + len(pending))

    @property
    def kv_usage(self) -> float:
        return 0.0           # not modelled (the planner reads it as telemetry only)

    def run_until(self, t_end: float) -> None:
        """Every arrival, turn and finish up to t_end, in time order."""
        while True:
            t_arrival = self._arrivals[self._next_arrival].arrival_s if self._next_arrival < len(self._arrivals) \
                else math.inf
            t_turn = max(self._free_at, self.now) if self._waiting else math.inf
            t_finish = self._running[0][0] if self._running else math.inf
            t = min(t_arrival, t_turn, t_finish)
            if t > t_end or t == math.inf:
                break
            self.now = max(self.now, t)
            if t == t_finish:
                self._finish()
            elif t == t_arrival:
                self._arrive(self._arrivals[self._next_arrival])
                self._next_arrival += 1
            else:
                self._begin()
        self.now = max(self.now, t_end)
        if self._next_arrival > 4096:            # forget what has arrived (else the list holds the whole day)
            del self._arrivals[:self._next_arrival]
            self._next_arrival = 0

    def _arrive(self, item: RequestLike) -> None:
        gap = item.arrival_s - self._rate_t
        decay = math.exp(-max(gap, 0.0) / LOAD_TIME_CONSTANT_S)
        self._rate = self._rate * decay + 1.0 / LOAD_TIME_CONSTANT_S
        self._rate_t = max(self._rate_t, item.arrival_s)
        deadline = item.arrival_s + self.model.slo_classes.get(item.slo_class).ttft_s
        heapq.heappush(self._waiting, (deadline, self._seq, item))
        self._seq += 1
        self._queued_tokens += item.prompt_tokens + item.output_tokens

    def _begin(self) -> None:
        _, seq, item = heapq.heappop(self._waiting)
        model, tokens = self.model, item.prompt_tokens + item.output_tokens
        utilization = self._rate / model.capacity.rate_rps
        self._free_at = self.now + model.prefill_s(item, utilization)
        first = max(self._free_at, self.now + model.lone_ttft_s(item))
        tpot = model.tpot_s(utilization)
        finished = first + tpot * max(item.output_tokens - 1, 0)
        slo = model.slo_classes.get(item.slo_class)
        # two token times carry the decode's mean gap: meets_slo judges it against the class's TBT
        times = (first, first + tpot) if item.output_tokens > 1 else (first,)
        record = RequestRecord(f"q-{seq}", item.arrival_s, first, finished, times, item.prompt_tokens,
                               item.output_tokens, item.output_tokens, "length", 0, slo.name, slo.ttft_s, slo.tbt_s)
        heapq.heappush(self._running, (finished, seq, record))
        self._queued_tokens -= tokens
        self._running_tokens += tokens

    def _finish(self) -> None:
        _, _, record = heapq.heappop(self._running)
        self._running_tokens -= record.num_prompt_tokens + record.num_output_tokens
        for listener in self.finish_listeners:
            listener(record)


def fit_queue_model(capacity: ReplicaCapacity, workload: Workload, slo_target: float, seed: int = 0,
                    slo_classes: SloClasses | None = None) -> QueueModel:
    """The largest decode share at which a lone replica keeps `slo_target` of the profile's probe
    requests (the same requests cluster/capacity_profile.py probed with) at the profiled capacity,
    bisected in [0, 0.95] (attainment falls as decoding takes more of the replica's time)."""
    classes = slo_classes or shipped_slo_classes()
    specs = probe_requests(workload, capacity.rate_rps, seed)

    def attainment(decode_share: float) -> float:
        replica = QueueReplica(QueueModel(capacity, decode_share, classes))
        met: list[bool] = []
        replica.finish_listeners.append(lambda r: met.append(meets_slo(r, classes.get(r.slo_class))))
        replica.submit(specs)
        replica.run_until(math.inf)
        return sum(met) / len(met)

    low, high = 0.0, 0.95
    if attainment(low) < slo_target:
        raise ValueError("queue model: even with no time spent decoding the replica misses the SLO target")
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (mid, high) if attainment(mid) >= slo_target else (low, mid)
    return QueueModel(capacity, low, classes)
