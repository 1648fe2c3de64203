"""Running a workload through the simulator in one call, and the capacity probe built on it."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.capacity import probe_size
from loadgen.workload import RequestSpec, Workload, generate
from simulation.profile_cost_model import StepTimeModel
from engine.outputs import RequestRecord
from engine.scheduling.error_budget import HORIZON_S, ErrorBudget
from simulation.simulator import Simulator
from simulation.speculation_model import SpeculationModel
from engine.slo_class import SloClass, shipped_slo_classes
from policies import DEFAULT_POLICY, Knobs
from telemetry.latency_summary import LatencySummary, summarize_requests


@dataclass
class SimulatedRun:
    records: list[RequestRecord]
    summary: LatencySummary
    num_steps: int
    num_rejected: int


def make_simulator(cost: StepTimeModel, policy: str, knobs: Knobs, slo: SloClass | None = None,
                   prefix_caching: bool = True, error_budget_horizon_s: float = HORIZON_S,
                   speculation: SpeculationModel | None = None) -> Simulator:
    """Requests of the default SLO class get `slo`'s targets (the run's --slo flags); the error
    budget spends over `error_budget_horizon_s` (the controller's context window, where one tunes);
    `speculation`: how the workload's drafts fare, where knobs.speculative_tokens drafts any."""
    classes = shipped_slo_classes()
    if slo is not None:
        classes = classes.with_default_targets(slo.ttft_s, slo.tbt_s)
    sim = Simulator(cost, cost.kv_blocks, cost.block_size, policy, knobs, slo_classes=classes,
                    prefix_caching=prefix_caching, speculation=speculation)
    sim.scheduler.error_budget = ErrorBudget(error_budget_horizon_s)   # as the daemon sets its engine's
    return sim


def shares_prefixes(specs: list[RequestSpec]) -> bool:
    """Whether any request shares a prompt prefix. Without one the prefix cache can never hit (the
    simulator's other prompts are unique), so a run without it is the same run without the cache's
    per-block bookkeeping; only the step records' prefix-cache counters differ (no lookups counted)."""
    return any(spec.prefix_group is not None for spec in specs)


def simulate(specs: list[RequestSpec], cost: StepTimeModel, policy: str = DEFAULT_POLICY, knobs: Knobs | None = None,
             slo: SloClass | None = None, error_budget_horizon_s: float = HORIZON_S,
             speculation: SpeculationModel | None = None) -> SimulatedRun:
    """Every request through to its end; rates are over first arrival to last finish."""
    sim = make_simulator(cost, policy, knobs or Knobs(), slo, prefix_caching=shares_prefixes(specs),
                         error_budget_horizon_s=error_budget_horizon_s, speculation=speculation)
    records: list[RequestRecord] = []
    sim.finish_listeners.append(records.append)
    sim.submit(specs)
    sim.run()
    duration = max(sim.now - (specs[0].arrival_s if specs else 0.0), 1e-9)
    rejected = [RequestRecord(f"rejected-{i}", 0.0, None, 0.0, (), 0, 0, 0, "error", 0)
                for i in range(sim.num_rejected)]
    return SimulatedRun(records, summarize_requests(records + rejected, slo or SloClass(), duration),
                        sim.num_steps, sim.num_rejected)


def simulated_probe(workload: Workload, cost: StepTimeModel, policy: str, knobs: Knobs, slo: SloClass,
                    num_requests: int, seed: int = 0, min_duration_s: float = 0.0,
                    speculation: SpeculationModel | None = None):
    """A capacity probe (loadgen.capacity): `num_requests` of the workload (more where they would
    arrive within `min_duration_s`: loadgen.capacity.probe_size), seeded, at the probed rate through
    the simulator."""
    def probe(qps: float) -> LatencySummary:
        specs = generate(workload, qps=qps, num_requests=probe_size(qps, num_requests, min_duration_s), seed=seed)
        return simulate(specs, cost, policy, knobs, slo, speculation=speculation).summary
    return probe
