"""One request's place in its grammar: which tokens may come next, the tokens it accepted, and the string the
grammar forces from here (jump-forward)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import xgrammar as xgr

from engine.structured.grammar_compiler import CompiledConstraint

# how far a request's grammar can step back: enough for a rejected speculative draft
MAX_ROLLBACK_TOKENS = 16


class GrammarState:
    def __init__(self, compiled: CompiledConstraint) -> None:
        self.compiled = compiled
        self._matcher = xgr.GrammarMatcher(compiled.grammar, max_rollback_tokens=MAX_ROLLBACK_TOKENS)
        self.num_forced = 0          # tokens the grammar forced (jump-forward), not sampled

    def copy(self) -> GrammarState:
        """A fresh state on the same grammar, for a fork of the request (n > 1)."""
        return GrammarState(self.compiled)

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Writes the allowed next tokens into bitmask[row]; False when every token is allowed."""
        return self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return self._matcher.accept_token(token)

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)

    @property
    def terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted: nothing may follow."""
        return self._matcher.is_terminated()

    def forced_tokens(self, limit: int, encode: Callable[[str], list[int]] | None = None) -> list[int]:
        """Up to `limit` tokens the grammar forces next, each accepted here. With `encode` (the model's own
        tokenizer, no special tokens) the forced string is tokenized as the model saw such text in training,
        its last token left out (the next sampled token may merge with it); else xgrammar's greedy
        tokenization, which leaves out a last token that a longer token could extend."""
        if limit <= 0:
            return []
        if encode is None:
            tokens = self._matcher.find_jump_forward_tokens()
        else:
            text = self._matcher.find_jump_forward_string()
            tokens = encode(text)[:-1] if text else []
        tokens = tokens[:limit]
        for i, token in enumerate(tokens):
            if not self._matcher.accept_token(token):
                return tokens[:i]
        self.num_forced += len(tokens)
        return tokens
