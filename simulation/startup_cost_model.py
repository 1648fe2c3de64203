"""The daemon's cost model at start-up: one that describes this model, dtype, device and machine, or
a calibration within a time budget (simulation/budgeted_calibration.py), or (with --no-calibrate, or
where the budget measured too few steps) the shipped one scaled by the live speed alone.

A cost model fitted elsewhere misprices every step here: on a faster CPU the deadline policy
would cut prefill chunks for nothing, on a GPU the warm start would search a machine that is not
there; a fit of dequantized fp32 steps prices a quantized engine's decodes at twice their time. So
a calibration is used only where its model, dtype, weights (dense or quantized), device kind and
machine fingerprint (simulation/machine.py) all match."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path

from simulation.budgeted_calibration import DEFAULT_BUDGET_S, VERIFY_SHARE, CalibrationTooShort, calibrate_within
from simulation.calibrate import default_cost_model_path, engine_meta
from simulation.cost_model_files import SHIPPED_COST_MODEL, state_dir_calibrations
from simulation.cost_model import CostModel
from simulation.verify_rows import measure_verify_rows
from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

# within the budget (calibration_budget_s, 60 s by default), up to 60 grid points and 4 requests' live steps
START_UP_POINTS = 60
START_UP_LIVE_REQUESTS = 4


@dataclass(frozen=True)
class CostModelChoice:
    model: CostModel
    source: str            # where it came from, for the log and /admin/tuning
    describes_machine: bool


def choose_cost_model(engine: LLMEngine, state_dir: str, calibrate_at_start: bool = True,
                      budget_s: float = DEFAULT_BUDGET_S) -> CostModelChoice:
    meta = engine_meta(engine)
    want = tuple(str(meta[key]) for key in ("model", "dtype", "device", "fingerprint", "weights"))
    for path in _candidates(state_dir):
        try:
            model = CostModel.load(path)
        except ValueError as e:
            log.warning("skipping %s", e)
            continue
        if model.describes(*want) and _same_crossover(engine, model):
            _adopt_crossover(engine, model)
            if model.verify_rows is None and calibrate_at_start:
                model = _with_verify_rows(engine, model, path, state_dir, budget_s)
            return CostModelChoice(model, str(path), True)
    what = f"{want[0]} {want[1]} ({want[4]} weights) on {want[3]}"
    if calibrate_at_start:
        log.info("no calibration describes %s: calibrating now, for at most %.0f s (calibration_budget_s; "
                 "--no-calibrate skips it)", what, budget_s)
        try:
            model = calibrate_within(engine, budget_s, START_UP_POINTS, START_UP_LIVE_REQUESTS)
        except CalibrationTooShort as e:
            source = (f"shipped {SHIPPED_COST_MODEL.name}, which does not describe {what} (the start-up calibration "
                      f"was too short: {e}): its shape, scaled to the live step times alone")
            log.warning("cost model: %s; a larger calibration_budget_s or `autotuned-serve calibrate` fits one", source)
            return CostModelChoice(CostModel.load(SHIPPED_COST_MODEL), source, False)
        path = default_cost_model_path(state_dir, model.model, model.dtype, model.device, model.weights)
        try:
            model.save(path)
        except OSError as e:   # a read-only or full state dir: the calibration serves this run, unsaved
            log.error("cannot save the start-up calibration to %s (%s): it is used for this run only, and the "
                      "next start calibrates again", path, e.strerror or e)
            path = "not saved"
        log.info("calibrated in the start-up in %s s: %s (holdout MAPE %.0f%%)", model.notes.get("calibration_s"),
                 path, 100 * (model.holdout_mape or 0))
        return CostModelChoice(model, f"calibrated at start-up: {path}", True)
    source = (f"shipped {SHIPPED_COST_MODEL.name}, which does not describe {what} (--no-calibrate): "
              "its shape, scaled to the live step times alone")
    log.warning("cost model: %s", source)
    return CostModelChoice(CostModel.load(SHIPPED_COST_MODEL), source, False)


def _with_verify_rows(engine: LLMEngine, model: CostModel, path: Path, state_dir: str,
                      budget_s: float) -> CostModel:
    """A calibration made without verification steps: they are measured now (within the start-up
    calibration's share for them) and saved with it, in the state dir (a shipped file stays as shipped)."""
    rows = measure_verify_rows(engine, time.monotonic() + VERIFY_SHARE * budget_s, repeats=1)
    if rows is None:
        return model
    model = replace(model, verify_rows=rows)
    if path.parent == SHIPPED_COST_MODEL.parent:
        path = default_cost_model_path(state_dir, model.model, model.dtype, model.device, model.weights)
    try:
        model.save(path)
    except OSError as e:
        log.warning("cannot add the verification steps to %s (%s): measured again at the next start", path,
                    e.strerror or e)
    return model


def _same_crossover(engine: LLMEngine, model: CostModel) -> bool:
    """A crossover fixed in the engine's config must be the one the model's steps were measured with."""
    fixed = engine.config.quantized_max_rows
    return fixed is None or model.kernel_max_rows == engine.runner.quantized_max_rows


def _adopt_crossover(engine: LLMEngine, model: CostModel) -> None:
    """Run steps on the path the model prices them on: the calibration's crossover, measured over the
    whole model, replaces the start-up's quick one, which moves with the machine's load."""
    if model.kernel_max_rows != engine.runner.quantized_max_rows:     # dense: both 0
        log.info("quantized kernels for steps of up to %d rows, as calibrated (start-up measure: %d)",
                 model.kernel_max_rows, engine.runner.quantized_max_rows)
        engine.runner.set_quantized_max_rows(model.kernel_max_rows)


def _candidates(state_dir: str) -> list[Path]:
    """The state dir's calibrations, newest first, then the shipped ones (the dense fp32 fit first)."""
    shipped = sorted(SHIPPED_COST_MODEL.parent.glob("*.json"), key=lambda p: p != SHIPPED_COST_MODEL)
    return [*state_dir_calibrations(state_dir), *shipped]
