"""Wall time of a step executed outside the engine loop: the one timing loop the calibrations share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.scheduling.scheduler import ScheduledRequest

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


def timed_runs(engine: LLMEngine, scheduled: Sequence[ScheduledRequest], repeats: int) -> list[float]:
    """Seconds of each of `repeats` executions of the step, each timed to its end."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        engine.runner.execute(scheduled)
        if engine.config.device.startswith("cuda"):
            torch.cuda.synchronize()            # kernels run asynchronously: time them to the end
        times.append(time.perf_counter() - start)
    return times
