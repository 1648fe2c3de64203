"""A constrained request verifying drafted tokens: the drafts cut to what its grammar allows, and each
verification row masked by the grammar as it stands after the drafts before that row.

The drafts are walked through the grammar when they are proposed and the grammar rolled back, so its
state stays that of the request's accepted output; the mask worker (step_masks.py, one thread, rows in
order) walks them again row by row during the forward pass and rolls back after the last row. The
tokens the step keeps are then accepted as any emission's (LLMEngine._append)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class Grammar(Protocol):
    def accept(self, token: int) -> bool: ...
    def rollback(self, num_tokens: int) -> None: ...


def allowed_drafts(grammar: Grammar, drafts: list[int]) -> list[int]:
    """The longest prefix of `drafts` the grammar accepts from its current state, which is left as it was."""
    taken = 0
    for token in drafts:
        if not grammar.accept(token):
            break
        taken += 1
    if taken:
        grammar.rollback(taken)
    return drafts[:taken]


@dataclass(frozen=True)
class GrammarAhead:
    """Row `ahead` of a verifying constrained request: its mask after drafts[:ahead]. The rows of one request
    are filled in order by one worker (StepMasks), so each advances the grammar one draft past the last."""

    grammar: object           # engine.structured.grammar_state.GrammarState
    drafts: tuple[int, ...]
    ahead: int

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        if self.ahead and not self.grammar.accept(self.drafts[self.ahead - 1]):
            raise RuntimeError("a drafted token the grammar allowed at proposal was refused")
        filled = self.grammar.fill_mask(bitmask, row)
        if self.ahead == len(self.drafts):
            self.grammar.rollback(len(self.drafts))
        return filled


def row_grammars(grammar, drafts: list[int]) -> list:
    """The mask sources of a request's 1 + len(drafts) sampling rows (None: unconstrained)."""
    if grammar is None or not drafts:
        return [grammar] * (1 + len(drafts))
    return [GrammarAhead(grammar, tuple(drafts), j) for j in range(len(drafts) + 1)]
