"""Running a workload through the simulator: the cost model to use (a calibration of this machine
or a hardware profile of a GPU) and a one-call what-if run."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from autotuner.workload import RequestSpec, Workload, generate
from engine.cost_model import CostModel
from engine.profile_cost_model import ProfileCostModel, StepTimeModel
from engine.outputs import RequestRecord
from engine.simulator import Simulator
from engine.slo_class import shipped_slo_classes
from policies import Knobs
from telemetry.latency_summary import LatencySummary, summarize_requests
from telemetry.window import SLO

log = logging.getLogger(__name__)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
# Fitted on the development machine (2-core EPYC, fp32) by `autotuned-serve calibrate`; the state
# dir's own calibration replaces it.
SHIPPED_COST_MODEL = CONFIGS / "cost_models" / "smollm2-135m-instruct-fp32-cpu.json"


def find_cost_model(path: str | None = None, state_dir: str | None = None) -> CostModel:
    """An explicit file, else the newest readable calibration in the state dir, else the shipped one.
    A state-dir calibration that no longer loads (e.g. fitted with an older feature set) is skipped
    with a warning, so an upgraded daemon still starts."""
    if path:
        return CostModel.load(path)
    calibrated = sorted(Path(state_dir).glob("cost_models/*.json"), key=os.path.getmtime) if state_dir else []
    for candidate in reversed(calibrated):
        try:
            return CostModel.load(candidate)
        except ValueError as e:
            log.warning("skipping %s", e)
    return CostModel.load(SHIPPED_COST_MODEL)


def resolve_cost_model(path: str | None = None, profile: str | None = None,
                       state_dir: str | None = None) -> StepTimeModel:
    """A hardware profile by name (configs/hardware_profiles/), else `find_cost_model`'s calibration."""
    if profile and path:
        raise ValueError("give a cost model file or a hardware profile, not both")
    if profile:
        return ProfileCostModel.named(profile)
    return find_cost_model(path, state_dir)


@dataclass
class SimulatedRun:
    records: list[RequestRecord]
    summary: LatencySummary
    num_steps: int
    num_rejected: int


def make_simulator(cost: StepTimeModel, policy: str, knobs: Knobs, slo: SLO | None = None) -> Simulator:
    """Requests of the default SLO class get `slo`'s targets (the run's --slo flags)."""
    classes = shipped_slo_classes()
    if slo is not None:
        classes = classes.with_default_targets(slo.ttft_s, slo.tbt_s)
    return Simulator(cost, cost.kv_blocks, cost.block_size, policy, knobs, slo_classes=classes)


def simulate(specs: list[RequestSpec], cost: StepTimeModel, policy: str = "sarathi", knobs: Knobs | None = None,
             slo: SLO | None = None) -> SimulatedRun:
    """Every request through to its end; rates are over first arrival to last finish."""
    sim = make_simulator(cost, policy, knobs or Knobs(), slo)
    records: list[RequestRecord] = []
    sim.finish_listeners.append(records.append)
    sim.submit(specs)
    sim.run()
    duration = max(sim.now - (specs[0].arrival_s if specs else 0.0), 1e-9)
    rejected = [RequestRecord(f"rejected-{i}", 0.0, None, 0.0, (), 0, 0, 0, "error", 0)
                for i in range(sim.num_rejected)]
    return SimulatedRun(records, summarize_requests(records + rejected, slo or SLO(), duration),
                        sim.num_steps, sim.num_rejected)


def simulated_probe(workload: Workload, cost: StepTimeModel, policy: str, knobs: Knobs, slo: SLO,
                    num_requests: int, seed: int = 0):
    """A capacity probe (autotuner.capacity): `num_requests` of the workload, seeded, at the probed
    rate through the simulator."""
    def probe(qps: float) -> LatencySummary:
        specs = generate(workload, qps=qps, num_requests=num_requests, seed=seed)
        return simulate(specs, cost, policy, knobs, slo).summary
    return probe
