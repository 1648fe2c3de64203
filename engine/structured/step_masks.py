"""A step's grammar masks: one bitmask row per constrained sampling row, filled on a worker thread while the
step's forward pass runs (the mask of a row depends only on tokens already accepted), applied by the sampler
before anything else shapes the row."""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.structured.grammar_state import GrammarState


@dataclass(frozen=True)
class FilledMasks:
    bitmask: torch.Tensor      # [sampling rows, words] int32 on the CPU; unconstrained rows allow every token
    rows: list[int]            # the constrained sampling rows
    fill_s: float              # time the worker spent filling them


class StepMasks:
    """Built by the engine for the rows it samples; `result()` waits for the worker (the sampler's first
    stage). No constrained row: nothing is submitted and result() is None."""

    _worker: ThreadPoolExecutor | None = None

    def __init__(self, states: list[GrammarState | None], vocab_size: int) -> None:
        self.rows = [i for i, s in enumerate(states) if s is not None]
        self._future: Future[FilledMasks] | None = None
        if self.rows:
            self._future = self._pool().submit(_fill, states, self.rows, vocab_size)

    @classmethod
    def _pool(cls) -> ThreadPoolExecutor:
        if cls._worker is None:
            cls._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        return cls._worker

    def result(self) -> FilledMasks | None:
        return None if self._future is None else self._future.result()


def _fill(states: list[GrammarState | None], rows: list[int], vocab_size: int) -> FilledMasks:
    import xgrammar as xgr

    start = time.perf_counter()
    bitmask = xgr.allocate_token_bitmask(len(states), vocab_size)
    for row in rows:
        states[row].fill_mask(bitmask, row)
    return FilledMasks(bitmask, rows, time.perf_counter() - start)


def apply_masks(logits: torch.Tensor, masks: FilledMasks, rows: list[int]) -> None:
    """-inf on the tokens each of `rows` (constrained rows) may not take (logits: [sampling rows, vocab],
    in place)."""
    import xgrammar as xgr

    bitmask = masks.bitmask.to(logits.device, non_blocking=True)
    indices = None if len(rows) == logits.shape[0] else rows
    xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1], indices=indices)


def refused(masks: FilledMasks, rows: list[int], tokens: torch.Tensor) -> list[int]:
    """Those of `rows` whose token in `tokens` (one per sampling row) their mask does not allow."""
    index = torch.tensor(rows)
    picked = tokens.cpu()[index]
    words = masks.bitmask[index, picked >> 5]
    allowed = (words >> (picked & 31)) & 1
    return [row for row, ok in zip(rows, allowed.tolist()) if not ok]
