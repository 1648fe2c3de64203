"""The calibrated step-time model kept to the machine's speed now, for the engine's scheduler (the
deadline policy prices every step with it) and the tuner (its warm start simulates with it).

The calibration is scaled by the median ratio of recent live step times to its predictions. A full
refit on live steps is not used: the steps of the last few minutes all ran at the current budget,
so a refit on them extrapolates to other budgets wildly (measured on the real daemon: a refit from
budget-32 steps made the warm start propose 1888)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from simulation.cost_model import CostModel, StepShape
from engine.llm_engine import LLMEngine
from engine.outputs import StepRecord

LIVE_STEPS = 2000            # live steps kept for the speed factor
MIN_LIVE_STEPS = 200         # fewer than this: the calibration as it is
REFRESH_EVERY_STEPS = 200    # how often the scheduler's copy is re-scaled (a median over LIVE_STEPS, ~ms)
SPEED_FACTOR_RANGE = (0.5, 2.0)   # a live machine further off its calibration than this wants a recalibration
# a model that does not describe this machine (--no-calibrate): only its shape is kept, the scale is live
UNCALIBRATED_RANGE = (0.001, 1000.0)


class LiveCostModel:
    def __init__(self, base: CostModel, source: str = "", describes_machine: bool = True) -> None:
        self.base, self.source, self.describes_machine = base, source, describes_machine
        self.speed_range = SPEED_FACTOR_RANGE if describes_machine else UNCALIBRATED_RANGE
        self._steps: deque[StepRecord] = deque(maxlen=LIVE_STEPS)
        self._engine: LLMEngine | None = None

    def attach(self, engine: LLMEngine) -> LiveCostModel:
        """Price `engine`'s steps with this model from now on, re-scaled as live steps come in. The
        model takes the engine's KV pool, so the warm start's simulations model this engine's pool,
        not the one the calibration ran with."""
        self._engine = engine
        blocks = engine.block_manager
        self.base = replace(self.base, kv_blocks=blocks.num_blocks, block_size=blocks.block_size)
        engine.scheduler.cost = self.current()
        engine.step_listeners.append(self.on_step)
        return self

    def on_step(self, record: StepRecord) -> None:
        self._steps.append(record)
        if self._engine is not None and record.step % REFRESH_EVERY_STEPS == 0:
            self._engine.scheduler.cost = self.current()

    def speed_factor(self) -> float:
        """Live step time over predicted, median of recent steps, within SPEED_FACTOR_RANGE."""
        steps = list(self._steps)
        if len(steps) < MIN_LIVE_STEPS:
            return 1.0
        ratios = [r.duration_s / self.base.predict(StepShape.of(r)) for r in steps]
        low, high = self.speed_range
        return min(high, max(low, float(np.median(ratios))))

    def describe(self) -> dict[str, object]:
        """For /admin/tuning: where the model came from and how far the live machine is off it."""
        return {"source": self.source, "describes_machine": self.describes_machine, "model": self.base.model,
                "dtype": self.base.dtype, "device": self.base.device, "fingerprint": self.base.fingerprint,
                "speed_factor": self.speed_factor()}

    def current(self) -> CostModel:
        factor = self.speed_factor()
        return self.base if factor == 1.0 else self.base.scaled(factor)
