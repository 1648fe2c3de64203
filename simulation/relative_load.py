"""A workload's rate relative to the modelled machine. `--load 0.8` runs the workload at 80% of the
largest base rate at which the simulated machine still meets the SLO with the default policy
(`deadline`, default knobs), so a what-if on any machine or hardware profile is neither idle nor
hopelessly overloaded. A workload's phases keep their rate multipliers, and the hardest phase sets
the capacity: each kind of traffic is probed alone at its peak rate (`peak_phases`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from loadgen.capacity import CapacityCriteria, search_capacity
from loadgen.workload import ArrivalProcess, Phase, Workload
from policies import Knobs
from simulation.profile_cost_model import StepTimeModel
from simulation.workload_run import simulated_probe
from engine.slo_class import SloClass

DEFAULT_LOAD = 0.8
PROBE_REQUESTS = 300     # per capacity probe at least, and ...
PROBE_MIN_S = 120.0      # ... at least this long of arrivals: 300 requests at a GPU's rates arrive within a
                         # fraction of a second, a burst any server queues, and the search ran up to its
                         # 2048 req/s ceiling on the H100 profile (the base rate then 0.8 of that)
MAX_PROBES = 12


class NoRateMeetsSlo(ValueError):
    """The modelled machine meets the SLO on a workload at no rate probed."""


@dataclass(frozen=True)
class BaseRate:
    qps: float                        # the workload's base rate for the run
    load: float | None                # the share of capacity asked for; None when --qps was given
    capacity_qps: float | None        # the simulated capacity it is a share of


def simulated_capacity(workload: Workload, cost: StepTimeModel, slo: SloClass, seed: int = 0,
                       num_requests: int = PROBE_REQUESTS) -> float:
    """The largest base rate (within 5%) at which every kind of the workload's traffic, alone at its
    peak rate, meets P50 TTFT and P99 TBT, by the capacity search with sustained probes (at least
    PROBE_MIN_S of arrivals each)."""
    return min(_capacity(peak, cost, slo, seed, num_requests) for peak in peak_phases(workload))


def peak_phases(workload: Workload) -> list[Workload]:
    """The workload as the capacity search probes it: one phase, as it is; else each kind of traffic
    (phases alike but for their name, share and rate) alone, at the highest rate any of its phases
    reaches, arriving as a steady process. Probed as a whole, a day's peak hours or a shift's
    summarization phase were a few of the probe's requests: their overload hardly moved its P50
    TTFT, and runs at 0.6 of that capacity left the best static configuration meeting the SLO for
    55-92% of the requests (zero-config matrix: A100 diurnal, CPU shift)."""
    if len(workload.phases) == 1:
        return [workload]
    peaks: dict[str, Phase] = {}
    for phase in workload.phases:
        steady = replace(phase, name=workload.name, share=None, requests=None, rate=_peak_rate(phase),
                         arrival=_steady(phase.arrival))
        kind = repr(replace(steady, rate=1.0))
        if kind not in peaks or steady.rate > peaks[kind].rate:
            peaks[kind] = steady
    return [Workload(f"{workload.name} ({i + 1} of {len(peaks)})", (p,), workload.qps)
            for i, p in enumerate(peaks.values())]


def _peak_rate(phase: Phase) -> float:
    arrival = phase.arrival
    return phase.rate * (max(arrival.ramp_from, arrival.ramp_to) if arrival.process == "ramp" else 1.0)


def _steady(arrival: ArrivalProcess) -> ArrivalProcess:
    return ArrivalProcess() if arrival.process == "ramp" else arrival


def _capacity(workload: Workload, cost: StepTimeModel, slo: SloClass, seed: int, num_requests: int) -> float:
    probe = simulated_probe(workload, cost, "deadline", Knobs(), slo, num_requests, seed, PROBE_MIN_S)
    result = search_capacity(probe, CapacityCriteria(slo.ttft_s, slo.tbt_s), start_qps=workload.qps,
                             max_probes=MAX_PROBES)
    if result.capacity_qps <= 0:
        raise NoRateMeetsSlo(f"the modelled machine meets the SLO on {workload.name!r} at no rate probed "
                         f"(down to {min(p.qps for p in result.probes):.3g} req/s); give --qps")
    return result.capacity_qps


def base_rate(workload: Workload, cost: StepTimeModel, slo: SloClass, qps: float | None, load: float | None,
              seed: int = 0) -> BaseRate:
    """An explicit --qps as given; otherwise --load (default 0.8) of the simulated capacity."""
    if qps is not None and load is not None:
        raise ValueError("give --qps or --load, not both")
    if qps is not None:
        if not qps > 0:
            raise ValueError(f"--qps must be > 0, got {qps}")
        return BaseRate(qps, None, None)
    load = DEFAULT_LOAD if load is None else load
    if not load > 0:
        raise ValueError(f"--load must be > 0, got {load}")
    capacity = simulated_capacity(workload, cost, slo, seed)
    return BaseRate(load * capacity, load, capacity)
