"""The daemon's cost model at start-up: one that describes this model, dtype, device and machine, or
a short calibration, or (with --no-calibrate) the shipped one scaled by the live speed alone.

A cost model fitted elsewhere misprices every step here: on a faster CPU the deadline policy
would cut prefill chunks for nothing, on a GPU the warm start would search a machine that is not
there. So a calibration is used only where its model, dtype, device kind and machine fingerprint
(simulation/machine.py) all match."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from simulation.calibrate import calibrate, default_cost_model_path, engine_meta
from simulation.cost_model_files import SHIPPED_COST_MODEL, state_dir_calibrations
from simulation.cost_model import CostModel
from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

# <= 60 s on the bundled model on the 2-core CPU: grid points for ~35 s, then 4 requests' live steps
START_UP_GRID_S = 35.0
START_UP_POINTS = 60
START_UP_LIVE_REQUESTS = 4


@dataclass(frozen=True)
class CostModelChoice:
    model: CostModel
    source: str            # where it came from, for the log and /admin/tuning
    describes_machine: bool


def choose_cost_model(engine: LLMEngine, state_dir: str, calibrate_at_start: bool = True) -> CostModelChoice:
    meta = engine_meta(engine)
    want = (str(meta["model"]), str(meta["dtype"]), str(meta["device"]), str(meta["fingerprint"]))
    for path in _candidates(state_dir):
        try:
            model = CostModel.load(path)
        except ValueError as e:
            log.warning("skipping %s", e)
            continue
        if model.describes(*want):
            return CostModelChoice(model, str(path), True)
    what = f"{want[0]} {want[1]} on {want[3]}"
    if calibrate_at_start:
        log.info("no calibration describes %s: calibrating now (about a minute; --no-calibrate skips it)", what)
        # no re-takes on a busy machine: a start-up is bounded in time; the live speed factor corrects it
        model = calibrate(engine, START_UP_POINTS, repeats=1, holdout_fraction=0.2,
                          live_requests=START_UP_LIVE_REQUESTS, time_limit_s=START_UP_GRID_S, retakes=0)
        path = model.save(default_cost_model_path(state_dir, model.model, model.dtype, model.device))
        log.info("calibrated in the start-up: %s (holdout MAPE %.0f%%)", path, 100 * (model.holdout_mape or 0))
        return CostModelChoice(model, f"calibrated at start-up: {path}", True)
    source = (f"shipped {SHIPPED_COST_MODEL.name}, which does not describe {what} (--no-calibrate): "
              "its shape, scaled to the live step times alone")
    log.warning("cost model: %s", source)
    return CostModelChoice(CostModel.load(SHIPPED_COST_MODEL), source, False)


def _candidates(state_dir: str) -> list[Path]:
    """The state dir's calibrations, newest first, then the shipped one."""
    return [*state_dir_calibrations(state_dir), SHIPPED_COST_MODEL]
