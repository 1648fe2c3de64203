"""Profile the real engine over a grid of step shapes and fit its cost model.

Each grid point is one step: `decodes` sequences with `decode_context` cached tokens each, plus an
optional prefill chunk of `chunk` tokens over `chunk_context` cached tokens. The requests are built
directly in the KV pool (placeholder token ids: timing does not depend on values) and the model
runner executes the step, so every point costs one forward pass and nothing else.
"""

from __future__ import annotations

import itertools
import logging
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from engine.cost_model import CostModel, StepShape, fit_cost_model
from engine.llm_engine import LLMEngine
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledRequest, ScheduleResult

log = logging.getLogger(__name__)

DECODE_BATCHES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
DECODE_CONTEXTS = (32, 128, 512, 1024, 2048)
CHUNKS = (0, 1, 8, 32, 64, 128, 256, 512, 1024)   # larger chunks only extend the linear, compute-bound regime
CHUNK_CONTEXTS = (0, 256, 1024, 3072)


@dataclass(frozen=True)
class GridPoint:
    decodes: int
    decode_context: int
    chunk: int
    chunk_context: int

    @property
    def kv_tokens(self) -> int:
        return self.decodes * (self.decode_context + 1) + self.chunk + self.chunk_context


def grid(max_kv_tokens: int, max_tokens: int, num_points: int, seed: int = 0) -> list[GridPoint]:
    """A random sample of the full grid, limited to what the KV pool holds and the budget allows."""
    points = [GridPoint(*p) for p in itertools.product(DECODE_BATCHES, DECODE_CONTEXTS, CHUNKS, CHUNK_CONTEXTS)]
    points = [p for p in points if (p.decodes or p.chunk) and (p.decodes or p.decode_context == DECODE_CONTEXTS[0])
              and (p.chunk or p.chunk_context == 0) and p.kv_tokens <= max_kv_tokens
              and p.decodes + p.chunk <= max_tokens]
    random.Random(seed).shuffle(points)
    return points[:num_points]


def _request(name: str, prompt_tokens: int, computed: int) -> Request:
    request = Request(name, [0] * prompt_tokens, SamplingParams(max_tokens=1, ignore_eos=True))
    request.num_computed_tokens = computed
    return request


def build_step(engine: LLMEngine, point: GridPoint) -> list[ScheduledRequest]:
    """The point's requests, holding KV blocks for their context and new tokens."""
    scheduled = []
    for i in range(point.decodes):
        request = _request(f"d{i}", point.decode_context, point.decode_context)
        request.output_token_ids.append(0)
        scheduled.append(ScheduledRequest(request, 1, point.decode_context))
    if point.chunk:
        request = _request("p", point.chunk_context + point.chunk, point.chunk_context)
        scheduled.append(ScheduledRequest(request, point.chunk, point.chunk_context))
    for s in scheduled:
        engine.block_manager.grow(s.request.block_table, s.context_len + s.num_tokens)
    return scheduled


def measure(engine: LLMEngine, point: GridPoint, repeats: int) -> tuple[StepShape, float]:
    """Median wall time of executing the point's step `repeats` times."""
    scheduled = build_step(engine, point)
    try:
        result = ScheduleResult.of(scheduled, 0, engine.scheduler.knobs, "calibration")
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.runner.execute(scheduled)
            times.append(time.perf_counter() - start)
    finally:
        for s in scheduled:
            engine.block_manager.free(s.request.block_table)
    return StepShape.of_schedule(result), statistics.median(times)


def calibrate(engine: LLMEngine, num_points: int = 120, repeats: int = 3, holdout_fraction: float = 0.2,
              seed: int = 0, progress: bool = True) -> CostModel:
    """Measure `num_points` grid points and fit; MAPE on the held-out share is in the result."""
    kv_tokens = engine.block_manager.num_free_blocks * engine.block_manager.block_size
    points = grid(kv_tokens, engine.config.max_token_budget, num_points, seed)
    measure(engine, GridPoint(4, 32, 64, 0), 2)    # warm-up
    shapes, seconds = [], []
    for point in tqdm(points, desc="calibrating", disable=not progress):
        shape, t = measure(engine, point, repeats)
        shapes.append(shape)
        seconds.append(t)
    return fit_cost_model(shapes, seconds, holdout_fraction, seed, model=engine.model_config.name,
                          dtype=str(engine.runner.dtype).removeprefix("torch."), device=engine.config.device,
                          kv_blocks=engine.block_manager.num_blocks, block_size=engine.block_manager.block_size)


def default_cost_model_path(state_dir: str | Path, model: str, dtype: str, device: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in model.lower())
    return Path(state_dir) / "cost_models" / f"{safe}-{dtype}-{device}.json"
