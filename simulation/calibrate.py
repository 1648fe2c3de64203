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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from simulation.cost_model import CostModel, StepShape, fit_cost_model, window_fields
from engine.llm_engine import LLMEngine
from simulation.machine import machine_fingerprint
from simulation.step_timing import timed_runs
from simulation.verify_rows import measure_verify_rows
from engine.outputs import StepRecord
from engine.kernels.quantized_linear import CROSSOVER_ROWS   # step rows timed on both paths
from engine.scheduling.request import Request
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduledRequest, ScheduleResult
from policies.step_shape import attended_pairs, context_tokens
from telemetry.other_load import OtherLoad

log = logging.getLogger(__name__)

DECODE_BATCHES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
DECODE_CONTEXTS = (32, 128, 512, 1024, 2048)
CHUNKS = (0, 1, 8, 32, 64, 128, 256, 512, 1024)   # larger chunks only extend the linear, compute-bound regime
CHUNK_CONTEXTS = (0, 256, 1024, 3072)
MAX_OTHER_LOAD = 0.10     # other processes' CPU share above which a point is measured again
MAX_RETAKES = 3
RETAKE_PAUSE_S = 2.0
CROSSOVER_DECODES = 128   # up to this many rows a crossover step is a decode batch, above it one prefill chunk
WARMUP_MAX_S = 0.25       # in a time budget, a step longer than this is timed without an untimed run before it


@dataclass(frozen=True)
class GridPoint:
    decodes: int
    decode_context: int
    chunk: int
    chunk_context: int

    def kv_blocks(self, block_size: int) -> int:
        """Blocks the point's requests hold (each request rounds up to whole blocks)."""
        per_decode = -(-(self.decode_context + 1) // block_size)
        return self.decodes * per_decode + -(-(self.chunk + self.chunk_context) // block_size)

    def shape(self) -> StepShape:
        """What the point's step computes (StepShape.of_schedule of build_step's requests, unbuilt)."""
        n, c, d, dc = self.chunk, self.chunk_context, self.decodes, self.decode_context
        return StepShape(num_prefill_tokens=n, num_decode_tokens=d, num_sampled=d + (n > 0),
                         context_tokens=d * context_tokens(1, dc) + (context_tokens(n, c) if n else 0),
                         attended_pairs=d * attended_pairs(1, dc) + attended_pairs(n, c), num_seqs=d + (n > 0))


def grid(max_kv_blocks: int, block_size: int, max_tokens: int, num_points: int, seed: int = 0,
         max_len: int = 1 << 30, kernel_max_rows: int = 0) -> list[GridPoint]:
    """A random sample of the full grid, limited to what the KV pool holds, the budget allows and
    the model's length admits; with `kernel_max_rows`, steps on the quantized kernels and steps
    above them alternate."""
    points = [GridPoint(*p) for p in itertools.product(DECODE_BATCHES, DECODE_CONTEXTS, CHUNKS, CHUNK_CONTEXTS)]
    points = [p for p in points if (p.decodes or p.chunk) and (p.decodes or p.decode_context == DECODE_CONTEXTS[0])
              and (p.chunk or p.chunk_context == 0) and p.kv_blocks(block_size) <= max_kv_blocks
              and p.decodes + p.chunk <= max_tokens and max(p.decode_context + 1, p.chunk + p.chunk_context) <= max_len]
    random.Random(seed).shuffle(points)
    if kernel_max_rows:
        points = _alternate([p for p in points if p.decodes + p.chunk <= kernel_max_rows],
                            [p for p in points if p.decodes + p.chunk > kernel_max_rows])
    return points[:num_points]


def _alternate(first: list[GridPoint], second: list[GridPoint]) -> list[GridPoint]:
    """One of each in turn while both last: a time-limited prefix then fits both paths of the cost model."""
    both = [p for pair in zip(first, second) for p in pair]
    n = min(len(first), len(second))
    return both + first[n:] + second[n:]


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


def measure(engine: LLMEngine, point: GridPoint, repeats: int, retakes: int | None = None,
            warmup: bool = True) -> tuple[StepShape, float]:
    """Median wall time of executing the point's step `repeats` times after one untimed run (none
    without `warmup`: a step of seconds loses the set-up's milliseconds in its own time); taken
    again (up to `retakes`, default MAX_RETAKES, times) while other processes used more than
    MAX_OTHER_LOAD of the CPU."""
    retakes = MAX_RETAKES if retakes is None else retakes
    scheduled = build_step(engine, point)
    try:
        result = ScheduleResult.of(scheduled, 0, engine.scheduler.knobs, "calibration")
        if warmup:   # untimed: the first step of a new shape pays for oneDNN/allocator set-up
            engine.runner.execute(scheduled)
        for attempt in range(retakes + 1):
            load = OtherLoad()
            times = timed_runs(engine, scheduled, repeats)
            if load.share() <= MAX_OTHER_LOAD:
                break
            if attempt == retakes:
                log.warning("calibration point %s measured while other processes used %.0f%% of the CPU",
                            point, 100 * load.share())
            else:
                time.sleep(RETAKE_PAUSE_S)
    finally:
        for s in scheduled:
            engine.block_manager.free(s.request.block_table)
    return StepShape.of_schedule(result), statistics.median(times)


def measure_step_crossover(engine: LLMEngine, repeats: int, retakes: int | None = None,
                           deadline: float | None = None,
                           observe: Callable[[StepShape, float, bool], None] | None = None) -> int:
    """The largest step up to which whole steps on the quantized kernels beat the same steps
    dequantized to the fp32 GEMM (stopping at the first loss), set as the engine's crossover. The
    start-up's guess times one matrix alone; the whole step (attention, norms, the LM head beside the
    matmuls) is what the cost model prices, so the crossover is measured on it. Steps are decode
    batches up to CROSSOVER_DECODES rows and single prefill chunks above (where the interleaved VNNI
    kernels still win, engine/kernels/csrc/qlinear_x16.c).

    With a `deadline` (time.monotonic()), no row count is started that the last one's timings,
    doubled, say would end past it; stopped so before a loss, the start-up's guess stands where it
    is above the largest count measured, and a step over WARMUP_MAX_S is timed without an untimed
    run before the next. `observe(shape, seconds, on_kernels)` sees each step measured."""
    runner, blocks = engine.runner, engine.block_manager
    guess = runner.quantized_max_rows
    best, timings, settled, last_s = 0, [], False, 0.0
    warmup = {"kernels": True, "dense": True}
    for rows in CROSSOVER_ROWS:
        point = (GridPoint(rows, DECODE_CONTEXTS[0], 0, 0) if rows <= CROSSOVER_DECODES
                 else GridPoint(0, DECODE_CONTEXTS[0], rows, 0))
        if rows > engine.config.max_token_budget or point.kv_blocks(blocks.block_size) > blocks.num_free_blocks:
            settled = True    # nothing larger can run: what was measured is the whole answer
            break
        if deadline is not None and time.monotonic() + 2 * last_s > deadline:
            break
        started = time.monotonic()
        runner.set_quantized_max_rows(rows)
        shape, kernel_s = measure(engine, point, repeats, retakes, warmup["kernels"])
        runner.set_quantized_max_rows(rows - 1)
        dense_s = measure(engine, point, repeats, retakes, warmup["dense"])[1]
        last_s = time.monotonic() - started
        if deadline is not None:   # short of time: a step of seconds is timed without an untimed one before it
            warmup = {"kernels": kernel_s <= WARMUP_MAX_S, "dense": dense_s <= WARMUP_MAX_S}
        if observe:
            observe(shape, kernel_s, True)
            observe(shape, dense_s, False)
        timings.append(f"{rows} rows {kernel_s * 1e3:.1f}/{dense_s * 1e3:.1f} ms")
        if kernel_s > dense_s:
            settled = True
            break
        best = rows
    else:
        settled = True
    if not settled and guess > best:
        log.info("calibration: out of time for the crossover after %d rows; the start-up's %d rows stand", best, guess)
        best = guess
    runner.set_quantized_max_rows(best)
    log.info("calibration: quantized kernels for steps of up to %d rows (kernels/dense: %s)", best, ", ".join(timings))
    return best


def live_steps(engine: LLMEngine, num_requests: int, seed: int = 0, max_prompt: int = 400, max_output: int = 128,
               deadline: float | None = None) -> list[StepRecord]:
    """Whole engine steps (scheduling, sampling and output handling included, which the grid's bare
    forward passes leave out) of a burst of chat-sized requests (prompts of 16-`max_prompt` tokens,
    8-`max_output` generated); at a `deadline` (time.monotonic()) the rest are aborted."""
    rng = random.Random(seed)
    records: list[StepRecord] = []
    ids = []
    engine.step_listeners.append(records.append)
    try:
        for _ in range(num_requests):
            top = max(1, min(max_prompt, engine.max_model_len // 2))
            prompt_len = rng.randint(min(16, top), top)
            prompt = [rng.randrange(engine.model_config.vocab_size) for _ in range(prompt_len)]
            top = max(1, min(max_output, engine.max_model_len // 4))
            output_len = rng.randint(min(8, top), top)
            ids.append(engine.add_request(prompt, SamplingParams(max_tokens=output_len, ignore_eos=True)))
        while engine.has_unfinished():
            if deadline is not None and time.monotonic() >= deadline:
                break
            engine.step()
    finally:
        engine.step_listeners.remove(records.append)
        for request_id in ids:
            engine.abort(request_id)    # those not finished by the deadline (or an error)
    return records


def calibrate(engine: LLMEngine, num_points: int = 120, repeats: int = 3, holdout_fraction: float = 0.2,
              seed: int = 0, progress: bool = True, live_requests: int = 32,
              retakes: int | None = None) -> CostModel:
    """Measure `num_points` grid points and the steps of `live_requests` requests, and fit; the
    MAPE on the held-out share is in the result. It takes what it takes (`autotuned-serve
    calibrate`); the daemon's start-up calibration keeps to a time budget
    (simulation/budgeted_calibration.py)."""
    blocks = engine.block_manager
    if engine.runner.quantized_path and engine.config.quantized_max_rows is None:
        measure_step_crossover(engine, repeats, retakes)
    verify_rows = measure_verify_rows(engine, repeats=repeats)
    points = grid(blocks.num_free_blocks, blocks.block_size, engine.config.max_token_budget, num_points, seed,
                  engine.max_model_len, engine.runner.quantized_max_rows)
    shapes, seconds = [], []
    for point in tqdm(points, desc="calibrating", disable=not progress):
        shape, t = measure(engine, point, repeats, retakes)
        shapes.append(shape)
        seconds.append(t)
    for record in live_steps(engine, live_requests, seed):
        shapes.append(StepShape.of(record))
        seconds.append(record.duration_s)
    return replace(fit_cost_model(shapes, seconds, holdout_fraction, seed, **engine_meta(engine)),
                   verify_rows=verify_rows)


def engine_meta(engine: LLMEngine) -> dict[str, object]:
    """What a cost model of `engine` records about what it describes."""
    device = engine.config.device
    return {"model": engine.model_config.name, "dtype": str(engine.runner.dtype).removeprefix("torch."),
            "device": device, "fingerprint": machine_fingerprint(device),
            "kv_blocks": engine.block_manager.num_blocks, "block_size": engine.block_manager.block_size,
            "weights": engine.runner.weights, "kernel_max_rows": engine.runner.quantized_max_rows,
            **window_fields(engine)}


def default_cost_model_path(state_dir: str | Path, model: str, dtype: str, device: str,
                            weights: str = "dense") -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in model.lower())
    suffix = "" if weights == "dense" else f"-{weights}"
    return Path(state_dir) / "cost_models" / f"{safe}-{dtype}{suffix}-{device}.json"
