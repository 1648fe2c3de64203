"""A per-step time model fitted to measured steps, in the spirit of Vidur and Sarathi-Serve.

    t = c + a * tokens + r * sqrt(tokens) + s * sampled
          + k * context_tokens + p * attended_pairs + q * sequences

`tokens` (prefill + decode) drive the linear layers. A matmul over few rows is far less efficient
per row than one over many (a GEMV streams the weights for one row; a CPU GEMM only reaches its
peak from a few dozen rows on), so a step's cost is concave in its tokens: the square-root term
carries that ramp (measured on the 2-core dev VM, decode steps at batch 1/8/32/64 cost
~46 + 40 * sqrt(batch) ms); `sampled` rows go through the LM head; `context_tokens` is KV
read, `attended_pairs` attention arithmetic (a chunk's quadratic term), `sequences` the per-sequence
bookkeeping. Coefficients are fitted by non-negative least squares on relative error, so a cheap
decode step weighs as much as an expensive prefill step. The simulator calls `predict` once per
step, so it is plain Python arithmetic.

An engine on quantized weights runs a step of up to `kernel_max_rows` tokens on the quantized
kernels (bandwidth-bound: a low constant, a steep per-row slope) and a larger one by dequantizing
and calling the fp32 GEMM (a high constant, fp32's slope): two regimes one line cannot fit. Such a
model has a second set of coefficients, fitted on the kernel steps alone, and each step is priced
with the set of the path it takes.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.kv_cache.block_manager import BLOCK_SIZE
from engine.kv_cache.kv_groups import KvGroups
from engine.outputs import StepRecord
from engine.scheduling.scheduler import ScheduleResult
from policies.step_shape import WindowedShape
from simulation.verify_rows import VerifyRows

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)

FEATURES = ("constant", "tokens", "sqrt_tokens", "sampled", "context_tokens", "attended_pairs", "sequences")


@dataclass(frozen=True)
class StepShape:
    """What a step computes; the same numbers a StepRecord carries."""

    num_prefill_tokens: int
    num_decode_tokens: int
    num_sampled: int
    context_tokens: int
    attended_pairs: int
    num_seqs: int
    grammar_rows: int = 0       # sampled rows held to a grammar: not a fitted feature (CostModel.grammar_row_s)
    draft_rows: int = 0         # decode rows verifying drafted tokens, among the above (CostModel.verify_rows)

    @staticmethod
    def of(record: StepRecord) -> StepShape:
        return StepShape(record.num_prefill_tokens, record.num_decode_tokens, record.head_rows or record.num_sampled,
                         record.context_tokens, record.attended_pairs,
                         record.num_prefill_seqs + record.num_decode_tokens, record.grammar_rows, record.draft_tokens)

    @staticmethod
    def of_schedule(result: ScheduleResult) -> StepShape:
        decodes = result.num_decode_tokens
        return StepShape(result.num_tokens - decodes, decodes, result.num_sampled, result.context_tokens,
                         result.attended_pairs, result.num_rows or len(result.scheduled), result.num_grammar_rows)

    def features(self) -> tuple[float, ...]:
        tokens = self.num_prefill_tokens + self.num_decode_tokens
        return (1.0, tokens, math.sqrt(tokens), self.num_sampled, self.context_tokens,
                self.attended_pairs, self.num_seqs)


@dataclass(frozen=True)
class CostModel:
    coefficients: tuple[float, ...]          # one per FEATURES entry, seconds per unit
    model: str = ""
    dtype: str = ""
    device: str = ""
    fingerprint: str = ""                    # simulation.machine.machine_fingerprint of the machine it was fitted on
    kv_blocks: int = 0                       # the calibrated engine's KV pool, which the simulator copies
    block_size: int = BLOCK_SIZE
    tile_tokens: int = 1                     # prefill chunks of a multiple of this are cheapest per token (GPU tiles)
    weights: str = "dense"                   # what the linear layers ran on: dense or quantized (engine.model_runner)
    kernel_max_rows: int = 0                 # steps of up to this many tokens ran on the quantized kernels
    kernel_coefficients: tuple[float, ...] = ()  # FEATURES' coefficients of those steps; `coefficients` price the rest
    fit_mape: float | None = None            # on the steps it was fitted to
    holdout_mape: float | None = None        # on steps kept out of the fit
    num_samples: int = 0
    notes: dict[str, str] = field(default_factory=dict)
    # a model with sliding-window layers: which layers slide and over how many keys, and whether the calibrated
    # engine kept its KV in pages per layer group (kv_blocks then counts pages); the simulator does the same
    layer_sliding: tuple[bool, ...] = ()
    window: int | None = None
    kv_pages: bool = False
    # live over predicted step times at percentiles 1-99 over their median (simulation.step_scatter): set on the
    # live daemon's copy for its warm start's simulations; empty in a calibration (steps exactly as predicted)
    step_scatter: tuple[float, ...] = ()
    # seconds per sampled row held to a grammar (its mask): measured live (simulation.live_cost_model), not fitted
    grammar_row_s: float = 0.0
    # measured steps of one decode verifying drafts (simulation/verify_rows.py): they price drafted rows
    verify_rows: VerifyRows | None = None

    def predict(self, shape: StepShape) -> float:
        return self.predict_with_drafts(shape.num_prefill_tokens, shape.num_decode_tokens, shape.num_sampled,
                                        shape.context_tokens, shape.attended_pairs, shape.num_seqs,
                                        shape.draft_rows) + self.grammar_row_s * shape.grammar_rows

    def draft_row_s(self, tokens: int, context: int) -> float | None:
        """Seconds one drafted row at `context` adds to a step of `tokens` tokens, from the measured
        verification steps; None without them (the fit prices the row as a decode)."""
        return None if self.verify_rows is None else self.verify_rows.row_s(tokens, context)

    def predict_with_drafts(self, prefill: int, decode: int, sampled: int, context: int, pairs: int, seqs: int,
                            drafts: int) -> float:
        """`predict_counts` of a step whose `drafts` rows (counted in decode, sampled and seqs) verify drafted
        tokens: with measured verification steps, those rows are priced by them at the step's mean row
        context, the rest by the fit."""
        if not drafts or self.verify_rows is None:
            return self.predict_counts(prefill, decode, sampled, context, pairs, seqs)
        row_context, row_pairs = context / seqs, pairs / seqs
        base = self.predict_counts(prefill, decode - drafts, sampled - drafts, round(context - drafts * row_context),
                                   round(pairs - drafts * row_pairs), seqs - drafts)
        tokens = prefill + decode - drafts
        rows = self.verify_rows
        return base + max(rows.step_s(tokens + drafts, row_context) - rows.step_s(tokens, row_context), 0.0)

    def predict_counts(self, prefill: int, decode: int, sampled: int, context: int, pairs: int, seqs: int) -> float:
        """`predict` without building a StepShape: the simulator's per-step hot path."""
        tokens = prefill + decode     # on_kernel_path(tokens), inlined: this runs for every planned chunk
        c0, tok, root, samp, ctx, pair, seq = (self.kernel_coefficients if 0 < tokens <= self.kernel_max_rows
                                               else self.coefficients)
        return (c0 + tok * tokens + root * math.sqrt(tokens) + samp * sampled + ctx * context
                + pair * pairs + seq * seqs)

    def describes(self, model: str, dtype: str, device: str, fingerprint: str, weights: str = "dense") -> bool:
        """Fitted on this model, dtype, weights and device kind, on a machine with this fingerprint."""
        return (self.model, self.dtype, self.device.split(":")[0], self.fingerprint, self.weights) == (
            model, dtype, device.split(":")[0], fingerprint, weights)

    def scaled(self, factor: float, kernel_factor: float | None = None) -> CostModel:
        """Every prediction times `factor` (the model is linear in its coefficients); steps on the
        quantized kernels times `kernel_factor` instead where given (each path drifts on its own)."""
        kernel_factor = factor if kernel_factor is None else kernel_factor
        rows = self.verify_rows    # measured on the kernels where the engine has them
        return replace(self, coefficients=tuple(c * factor for c in self.coefficients),
                       kernel_coefficients=tuple(c * kernel_factor for c in self.kernel_coefficients),
                       verify_rows=rows and rows.scaled(kernel_factor if self.kernel_max_rows else factor),
                       notes=self.notes | {"speed_factor": f"{factor:.3f}", "kernel_speed_factor": f"{kernel_factor:.3f}"})

    def on_kernel_path(self, tokens: int) -> bool:
        """Whether a step of this many tokens runs on the quantized kernels (else dense)."""
        return 0 < tokens <= self.kernel_max_rows

    def mape(self, shapes: list[StepShape], seconds: list[float]) -> float:
        predicted = np.array([self.predict(s) for s in shapes])
        actual = np.asarray(seconds)
        return float(np.mean(np.abs(predicted - actual) / actual))

    def kv_groups(self) -> KvGroups | None:
        """The calibrated engine's KV pages per layer group, for the simulator's pool (None: blocks of every layer)."""
        return KvGroups.of(self.layer_sliding, self.window, self.block_size) if self.kv_pages else None

    def step_shape(self) -> WindowedShape | None:
        """What the model's steps attend to, where some layers attend to a window (policies/step_shape.py)."""
        return WindowedShape.of(self.layer_sliding, self.window)

    # -- persistence: one JSON file per model/dtype/device --
    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = asdict(self) | {"features": list(FEATURES)}
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
            if data.pop("features") != list(FEATURES):
                raise ValueError("it was fitted with other features; run `autotuned-serve calibrate` again")
            data["coefficients"] = tuple(data["coefficients"])
            data["kernel_coefficients"] = tuple(data.get("kernel_coefficients", ()))
            data["layer_sliding"] = tuple(data.get("layer_sliding", ()))
            data["step_scatter"] = tuple(data.get("step_scatter", ()))
            data["verify_rows"] = VerifyRows.from_dict(data.get("verify_rows"))
            model = CostModel(**data)
            if model.kernel_max_rows and len(model.kernel_coefficients) != len(FEATURES):
                raise ValueError(f"kernel_max_rows {model.kernel_max_rows} without {len(FEATURES)} kernel coefficients")
            return model
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"cannot read cost model {path}: {e}") from e


def window_fields(engine: LLMEngine) -> dict[str, object]:
    """CostModel's fields on sliding-window layers for `engine`: which layers slide, over how many keys, and
    whether its KV is in pages per layer group (the defaults for a model without such layers)."""
    mc = engine.model_config
    if mc.window is None:
        return {"layer_sliding": (), "window": None, "kv_pages": False}
    return {"layer_sliding": mc.layer_sliding, "window": mc.window,
            "kv_pages": engine.runner.kv_groups is not None}


def fit_cost_model(shapes: list[StepShape], seconds: list[float], holdout_fraction: float = 0.0,
                   seed: int = 0, **meta) -> CostModel:
    """Non-negative least squares on relative error; optionally keeps a random share out to report MAPE on.
    With `kernel_max_rows` in `meta`, the steps of each path are fitted on their own."""
    if len(shapes) != len(seconds) or len(shapes) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} measured steps to fit a cost model, got {len(shapes)}")
    order = np.random.default_rng(seed).permutation(len(shapes))
    num_holdout = int(len(shapes) * holdout_fraction)
    held, used = order[:num_holdout], order[num_holdout:]
    rows = int(meta.get("kernel_max_rows", 0))
    on_kernels = [i for i in used if _tokens(shapes[i]) <= rows]
    on_dense = [i for i in used if _tokens(shapes[i]) > rows]
    if rows and min(len(on_kernels), len(on_dense)) < len(FEATURES):
        log.warning("%d kernel and %d dense steps: too few to fit each path, one fit prices both",
                    len(on_kernels), len(on_dense))
        coefficients = _nnls_fit(shapes, seconds, list(used))
        kernel = coefficients
    else:
        coefficients = _nnls_fit(shapes, seconds, on_dense)
        kernel = _nnls_fit(shapes, seconds, on_kernels) if rows else ()
    model = CostModel(coefficients, kernel_coefficients=kernel, num_samples=len(used), **meta)
    fit_mape = model.mape([shapes[i] for i in used], [seconds[i] for i in used])
    holdout = model.mape([shapes[i] for i in held], [seconds[i] for i in held]) if num_holdout else None
    return replace(model, fit_mape=fit_mape, holdout_mape=holdout)


def _tokens(shape: StepShape) -> int:
    return shape.num_prefill_tokens + shape.num_decode_tokens


def _nnls_fit(shapes: list[StepShape], seconds: list[float], indices: list[int]) -> tuple[float, ...]:
    if len(indices) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} measured steps on each path to fit a cost model, "
                         f"got {len(indices)}")
    x = np.array([shapes[i].features() for i in indices], dtype=float)
    y = np.array([seconds[i] for i in indices], dtype=float)
    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    weights = 1.0 / y                      # relative error: divide each row by its own time
    from scipy.optimize import nnls   # on first use: scipy's import is tens of MB resident
    coef, _ = nnls(x / scale * weights[:, None], y * weights)
    return tuple(float(c) for c in coef / scale)
