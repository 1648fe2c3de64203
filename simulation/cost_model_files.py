"""Which step-time model a run uses: an explicit calibration file, the state dir's newest, the
shipped one, or a GPU hardware profile by name."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from simulation.cost_model import CostModel
from simulation.profile_cost_model import ProfileCostModel, StepTimeModel

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
    for candidate in state_dir_calibrations(state_dir):
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


def state_dir_calibrations(state_dir: str | None) -> list[Path]:
    """The state dir's calibrated cost models, newest first."""
    if not state_dir:
        return []
    return sorted(Path(state_dir).glob("cost_models/*.json"), key=os.path.getmtime, reverse=True)
