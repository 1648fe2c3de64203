"""Profiling one replica for the planner (cluster/replica_capacity.py): on its step-time model, in
the simulator, the largest Poisson rate of a workload's mix at which `slo_target` of requests meet
their SLO class, and the mean TTFT and TPOT on the way there (Dynamo's pre-deployment profiling,
done here in seconds because the replica is simulated)."""

from __future__ import annotations

from dataclasses import replace

from cluster.replica_capacity import LatencyPoint, ReplicaCapacity
from cluster.replica_telemetry import ReplicaTelemetry
from engine.slo_class import SloClass
from loadgen.workload import RequestSpec, Workload, generate
from policies import DEFAULT_POLICY, Knobs
from simulation.profile_cost_model import StepTimeModel
from simulation.workload_run import simulate

PROBE_S = 90.0           # each probe: this many seconds of arrivals...
MIN_REQUESTS = 300       # ...and at least this many requests
TOLERANCE = 0.05


def at_rate(specs: list[RequestSpec], rate_rps: float) -> list[RequestSpec]:
    """The same requests, arrival gaps rescaled so they come at `rate_rps` on average."""
    span = specs[-1].arrival_s - specs[0].arrival_s
    scale = (len(specs) - 1) / span / rate_rps if span > 0 else 0.0
    return [replace(s, arrival_s=(s.arrival_s - specs[0].arrival_s) * scale) for s in specs]


def profile_replica(workload: Workload, cost: StepTimeModel, policy: str = DEFAULT_POLICY, knobs: Knobs | None = None,
                    slo_target: float = 0.99, seed: int = 0, max_probes: int = 9) -> ReplicaCapacity:
    base = generate(workload, num_requests=4096, seed=seed)
    prompt = sum(s.prompt_tokens for s in base) / len(base)
    output = sum(s.output_tokens for s in base) / len(base)
    prefill_s, decode_s = token_times(cost, prompt, output)
    probes: dict[float, tuple[bool, float, float]] = {}

    def probe(rate: float) -> bool:
        run = simulate(probe_requests(workload, rate, seed), cost, policy, knobs)
        seen = ReplicaTelemetry.of(run.records, SloClass(), 0.0)     # the tightest class's latencies, as the fleet's
        ok = (run.summary.slo_attainment or 0.0) >= slo_target
        probes[rate] = (ok, seen.ttft_mean_s or 0.0, seen.tpot_mean_s or 0.0)
        return ok

    capacity = _search(probe, 0.5 / (prompt * prefill_s + output * decode_s), max_probes)
    probe(0.25 * capacity)
    cached = sum(s.prefix_tokens for s in base) / sum(s.prompt_tokens for s in base)
    points = tuple(LatencyPoint(rate / capacity, ttft, tpot) for rate, (_, ttft, tpot) in sorted(probes.items())
                   if rate <= capacity)
    return ReplicaCapacity(capacity, prompt, output, cached, prefill_s, decode_s, points)


def probe_requests(workload: Workload, rate_rps: float, seed: int = 0) -> list[RequestSpec]:
    """One probe's requests: PROBE_S of arrivals at `rate_rps` (at least MIN_REQUESTS of them)."""
    n = max(MIN_REQUESTS, int(rate_rps * PROBE_S))
    return at_rate(generate(workload, num_requests=n, seed=seed), rate_rps)


def token_times(cost: StepTimeModel, prompt: float, output: float) -> tuple[float, float]:
    """Replica seconds per uncached prompt token (a 2048-token chunk) and per output token (a
    decode batch of 64 at the mix's mean context), from the step-time model."""
    chunk = 2048
    prefill = cost.predict_counts(chunk, 0, 1, 0, chunk * chunk // 2, 1) / chunk
    batch, context = 64, int(64 * (prompt + output / 2))
    decode = cost.predict_counts(0, batch, batch, context, context, batch) / batch
    return prefill, decode


def _search(probe, start: float, max_probes: int) -> float:
    """The largest passing rate: doubling (or halving) from `start` to a bracket, then bisection."""
    used, rate = 1, start
    lo, hi = (start, None) if probe(start) else (0.0, start)
    while used < max_probes and (hi is None or lo == 0.0):
        used += 1
        rate = rate * 2 if hi is None else rate / 2
        if probe(rate):
            lo = rate
        else:
            hi = rate
    while hi is not None and used < max_probes and hi - lo > TOLERANCE * hi:
        used += 1
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if probe(mid) else (lo, mid)
    if lo == 0.0:
        raise ValueError("the replica meets the SLO at no rate probed")
    return lo
