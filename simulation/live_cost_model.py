"""The calibrated step-time model kept to the machine's speed now, for the engine's scheduler (the
deadline policy prices every step with it) and the tuner (its warm start simulates with it).

The calibration is scaled by the median ratio of recent live step times to its predictions. A full
refit on live steps is not used: the steps of the last few minutes all ran at the current budget,
so a refit on them extrapolates to other budgets wildly (measured on the real daemon: a refit from
budget-32 steps made the warm start propose 1888).

A quantized engine runs small steps on its own kernels and larger ones dense, and the two paths
drift apart, so one median over all steps (nearly all decodes, on the kernels) would price every
deadline-sized prefill step (on the dense path) by the decodes' speed. Each path gets
its own ratio once it has MIN_PATH_STEPS of the recent steps; until then, the overall one."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from simulation.cost_model import CostModel, StepShape, window_fields
from simulation.step_scatter import DEADLINE_QUANTILE, measured_scatter, sigma_of
from engine.llm_engine import LLMEngine
from engine.outputs import StepRecord

LIVE_STEPS = 2000            # live steps kept for the speed factor
MIN_LIVE_STEPS = 200         # fewer than this: the calibration as it is
MIN_PATH_STEPS = 30          # a weights path (quantized kernels, dense) with fewer: the overall ratio
REFRESH_EVERY_STEPS = 200    # how often the scheduler's copy is re-scaled (a median over LIVE_STEPS, ~ms)
EARLY_REFRESH_STEPS = 25     # ... and how often before that many steps: 200 steps are a minute on a CPU
# The scheduler's copy prices deadlines at the TBT SLO's percentile (the 99th) of live over predicted
# (simulation.step_scatter.DEADLINE_QUANTILE) of the steps it sizes to a TBT slack, those carrying
# prefill: a step over the target gives every decode in it a long gap, and under overload every step
# fills its slack, so one in ten overrunning (the 90th percentile, measured on an AVX-512 EPYC at 2x
# capacity) failed most requests' own P99 TBT; with step_headroom's margin fewer than one in a hundred
# overrun. Decode-only steps are not sized and run on a ratio of their own (bundled model, AVX2: 0.8
# against 1.0 at the median), so a quantile over all steps, nearly all decodes, priced prefill steps
# short. Until MIN_PATH_STEPS of them have run, the calibration is taken SIZED_PRIOR slower: a fit gives
# the median, and at the median a started daemon's first half-minute of prefill steps overran. The
# tuner's simulations want expected times, the median over all steps, with that scatter
# (`step_scatter`) drawn around them.
SIZED_PRIOR = 1.4            # prefill steps' 99th percentile of live over a calibration, about (AVX2 EPYC, chat:
                             # 90th 1.24-1.28; AVX-512 EPYC: the 99th 1.27x the median)
MIN_GRAMMAR_STEPS = 10       # constrained steps before their masks' measured time prices constrained rows
SPEED_FACTOR_RANGE = (0.5, 2.0)   # a live machine further off its calibration than this wants a recalibration
# a model that does not describe this machine (--no-calibrate): only its shape is kept, the scale is live
UNCALIBRATED_RANGE = (0.001, 1000.0)


class LiveCostModel:
    def __init__(self, base: CostModel, source: str = "", describes_machine: bool = True) -> None:
        self.base, self.source, self.describes_machine = base, source, describes_machine
        self.speed_range = SPEED_FACTOR_RANGE if describes_machine else UNCALIBRATED_RANGE
        self._steps: deque[StepRecord] = deque(maxlen=LIVE_STEPS)
        self._seen = 0      # steps recorded since start
        self._engine: LLMEngine | None = None

    def attach(self, engine: LLMEngine) -> LiveCostModel:
        """Price `engine`'s steps with this model from now on, re-scaled as live steps come in. The
        model takes the engine's KV pool, so the warm start's simulations model this engine's pool,
        not the one the calibration ran with."""
        self._engine = engine
        blocks = engine.block_manager
        self.base = replace(self.base, kv_blocks=blocks.num_blocks, block_size=blocks.block_size,
                            **window_fields(engine))   # and its layers' windows and pages, where it has any
        engine.scheduler.cost = self.for_deadlines()
        engine.step_listeners.append(self.on_step)
        return self

    def on_step(self, record: StepRecord) -> None:
        self._steps.append(record)
        self._seen += 1
        every = EARLY_REFRESH_STEPS if self._seen < REFRESH_EVERY_STEPS else REFRESH_EVERY_STEPS
        if self._engine is not None and self._seen % every == 0:
            self._engine.scheduler.cost = self.for_deadlines()

    def speed_factor(self) -> float:
        """Live step time over predicted, median of recent steps, within SPEED_FACTOR_RANGE."""
        return self.speed_factors()[0]

    def speed_factors(self, quantile: float = 0.5) -> tuple[float, float, float]:
        """(overall, dense path, quantized-kernel path) live-over-predicted ratios at `quantile` (the
        median by default); a path with too few recent steps of its own takes the overall one."""
        ratios, on_kernels, _ = self._ratios()
        if len(ratios) < MIN_LIVE_STEPS:
            return 1.0, 1.0, 1.0
        overall = self._bounded(np.quantile(ratios, quantile))
        paths = [self._bounded(np.quantile(ratios[mask], quantile)) if mask.sum() >= MIN_PATH_STEPS else overall
                 for mask in (~on_kernels, on_kernels)]
        return overall, paths[0], paths[1]

    def sized_factors(self) -> tuple[float, float]:
        """(dense path, quantized-kernel path) live-over-predicted ratios at DEADLINE_QUANTILE of the recent steps
        that carried prefill: a path's own where it has MIN_PATH_STEPS of them, else those of both paths, else
        SIZED_PRIOR."""
        ratios, on_kernels, prefill = self._ratios()
        if prefill.sum() < MIN_PATH_STEPS:
            return SIZED_PRIOR, SIZED_PRIOR
        both = self._bounded(np.quantile(ratios[prefill], DEADLINE_QUANTILE))
        dense, kernel = (self._bounded(np.quantile(ratios[m], DEADLINE_QUANTILE)) if m.sum() >= MIN_PATH_STEPS else both
                         for m in (prefill & ~on_kernels, prefill & on_kernels))
        return dense, kernel

    def step_scatter(self) -> tuple[float, ...]:
        """How recent steps scatter around the model once each weights path's median speed is taken out
        (simulation.step_scatter); empty with too few steps."""
        ratios, on_kernels, _ = self._ratios()
        if len(ratios) < MIN_LIVE_STEPS:
            return ()
        residuals = [ratios[mask] / np.median(ratios[mask]) for mask in (~on_kernels, on_kernels)
                     if mask.sum() >= MIN_PATH_STEPS]
        return measured_scatter(np.concatenate(residuals) if residuals else ratios)

    def _ratios(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each recent step's live over predicted time, whether it ran on the quantized kernels, and whether it
        carried prefill."""
        steps = list(self._steps)
        ratios = np.array([r.duration_s / self.base.predict(StepShape.of(r)) for r in steps])
        on_path = getattr(self.base, "on_kernel_path", None)      # a hardware profile has one path
        on_kernels = np.array([bool(on_path and on_path(r.num_prefill_tokens + r.num_decode_tokens)) for r in steps],
                              dtype=bool)
        prefill = np.array([r.num_prefill_tokens > 0 for r in steps], dtype=bool)
        return ratios, on_kernels, prefill

    def grammar_row_s(self) -> float:
        """Median mask time per constrained row over recent steps that had any (0 with too few): the
        masks are filled beside the forward pass, so on a machine whose cores the forward already fills
        this is what they add; a GPU step hides part of it, which the speed factor then absorbs."""
        per_row = [r.mask_s / r.grammar_rows for r in self._steps if r.grammar_rows]
        return float(np.median(per_row)) if len(per_row) >= MIN_GRAMMAR_STEPS else 0.0

    def _bounded(self, ratio: float) -> float:
        low, high = self.speed_range
        return min(high, max(low, float(ratio)))

    def describe(self) -> dict[str, object]:
        """For /admin/tuning: where the model came from and how far the live machine is off it."""
        overall, dense, kernel = self.speed_factors()
        return {"source": self.source, "describes_machine": self.describes_machine, "model": self.base.model,
                "dtype": self.base.dtype, "device": self.base.device, "fingerprint": self.base.fingerprint,
                "speed_factor": overall, "dense_speed_factor": dense, "kernel_speed_factor": kernel,
                "scatter_sigma": sigma_of(self.step_scatter()), "live_over_predicted": self.ratio_quantiles()}

    def ratio_quantiles(self) -> dict[str, float]:
        """Recent steps' live over predicted time at the percentiles that price them (50, 90) and that the TBT
        SLO reads (99): how far the model's tail is off, which the median and scatter_sigma do not show."""
        ratios = self._ratios()[0]
        if len(ratios) < MIN_LIVE_STEPS:
            return {}
        return {f"p{q}": float(np.quantile(ratios, q / 100)) for q in (50, 90, 99)}

    def current(self, quantile: float = 0.5, scatter: bool = False) -> CostModel:
        """The calibration scaled to the live machine by `quantile` of its live-over-predicted ratios (for
        the warm start's simulations); with `scatter`, carrying the live scatter around them. The warm
        start simulates without it: drawn i.i.d. for every step, the scatter (mostly that of ~10-ms
        decode steps) overruns slack-filling steps that live run close to their median, and ranks a
        64-token cap level with the defaults, which live serve more (docs/design/cost_models.md)."""
        model, spread = self._scaled(quantile), self.step_scatter() if scatter else ()
        return replace(model, step_scatter=spread) if spread else model

    def for_deadlines(self) -> CostModel:
        """The scheduler's copy: the calibration scaled by the sized steps' ratios (`sized_factors`)."""
        return self._with_factors(*self.sized_factors())

    def _scaled(self, quantile: float) -> CostModel:
        """The calibration scaled by `quantile` of the live ratios, per weights path."""
        _, dense, kernel = self.speed_factors(quantile)
        return self._with_factors(dense, kernel)

    def _with_factors(self, dense: float, kernel: float) -> CostModel:
        if dense == kernel == 1.0:
            model = self.base
        elif getattr(self.base, "kernel_max_rows", 0):
            model = self.base.scaled(dense, kernel)
        else:
            model = self.base.scaled(dense)
        grammar_row_s = self.grammar_row_s()
        return replace(model, grammar_row_s=grammar_row_s) if grammar_row_s else model
