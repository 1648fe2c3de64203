"""Grammars compiled by xgrammar on a worker thread, never on the engine loop's: a request's constraint is
compiled before the request is admitted, and an LRU cache keyed by the constraint serves repeats at once.
xgrammar's compile releases the GIL, so a compile costs the engine loop a core's share, not its thread."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from engine.errors import InvalidRequestError
from engine.structured.constraint import Constraint, ConstraintKind, choice_grammar
from engine.structured.schema_support import check_supported, searching_patterns

log = logging.getLogger(__name__)

DEFAULT_CACHE_SIZE = 256
ANY_OBJECT = '{"type": "object"}'     # OpenAI's JSON mode: any JSON object
DEFAULT_COMPILE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CompiledConstraint:
    constraint: Constraint
    grammar: xgr.CompiledGrammar
    compile_s: float


def tokenizer_info(tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...]) -> xgr.TokenizerInfo:
    """xgrammar's view of the engine's vocabulary: every row of the LM head (the model's vocab_size, padding
    included, so masks cover whole logit rows), with the engine's end-of-generation ids as stop tokens."""
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:
        return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids))
    byte_vocab = getattr(tokenizer, "byte_vocabulary", None)
    if byte_vocab is None:
        raise InvalidRequestError("this model's tokenizer does not support constrained decoding", "response_format")
    return xgr.TokenizerInfo(byte_vocab(vocab_size), xgr.VocabType.RAW, vocab_size=vocab_size,
                             stop_token_ids=list(stop_token_ids))


class GrammarCompiler:
    """`on_compiled(kind, seconds)`: told of every compile that ran (not of cache hits), for the metrics."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: tuple[int, ...],
                 cache_size: int = DEFAULT_CACHE_SIZE, timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S) -> None:
        self._tokenizer, self._vocab_size, self._stop_ids = tokenizer, vocab_size, stop_token_ids
        self.cache_size, self.timeout_s = cache_size, timeout_s
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._compiler: xgr.GrammarCompiler | None = None
        self._cache: OrderedDict[tuple[str, str, bool], Future[CompiledConstraint]] = OrderedDict()
        self._lock = threading.Lock()
        self.on_compiled: list[Callable[[str, float], None]] = []
        self.compile_thread_ids: set[int] = set()     # where compiles ran (tests check it is not the loop's)

    @property
    def bitmask_width(self) -> int:
        return xgr.get_bitmask_shape(1, self._vocab_size)[1]

    def submit(self, constraint: Constraint) -> Future[CompiledConstraint]:
        """The compiled constraint, from the cache or compiled on the worker."""
        with self._lock:
            found = self._cache.get(constraint.key)
            if found is not None:
                self._cache.move_to_end(constraint.key)
                return found
            future = self._worker.submit(self._compile, constraint)
            self._cache[constraint.key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        future.add_done_callback(lambda f: self._forget_failure(constraint, f))
        return future

    def compile(self, constraint: Constraint) -> CompiledConstraint:
        """Blocking: for callers off the event loop. InvalidRequestError naming the problem, a 400."""
        try:
            return self.submit(constraint).result(self.timeout_s)
        except FutureTimeout:
            raise self._too_slow(constraint) from None

    async def compile_async(self, constraint: Constraint) -> CompiledConstraint:
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(constraint)), self.timeout_s)
        except TimeoutError:
            raise self._too_slow(constraint) from None

    def _too_slow(self, constraint: Constraint) -> InvalidRequestError:
        # the compile goes on and is cached: the same constraint sent again may be served
        return InvalidRequestError(f"the {constraint.kind.value} constraint did not compile within "
                                   f"{self.timeout_s:g} s", constraint.param)

    def _forget_failure(self, constraint: Constraint, future: Future) -> None:
        if future.exception() is not None:
            with self._lock:
                if self._cache.get(constraint.key) is future:
                    del self._cache[constraint.key]

    def _compile(self, constraint: Constraint) -> CompiledConstraint:
        self.compile_thread_ids.add(threading.get_ident())
        if self._compiler is None:    # built here, on first use: 0.2-1 s for a large vocabulary
            info = tokenizer_info(self._tokenizer, self._vocab_size, self._stop_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        start = time.perf_counter()
        try:
            grammar = _compile_with(self._compiler, constraint)
        except InvalidRequestError:
            raise
        except Exception as e:    # xgrammar raises RuntimeError, ValueError and its own types for bad input
            reason = " ".join(str(e).split())
            raise InvalidRequestError(f"the {constraint.kind.value} constraint does not compile: {reason}",
                                      constraint.param) from e
        seconds = time.perf_counter() - start
        if not _admits_a_first_token(grammar, self._vocab_size):
            raise InvalidRequestError(f"the {constraint.kind.value} constraint cannot start with any token of this "
                                      "model's vocabulary", constraint.param)
        for listener in self.on_compiled:
            listener(constraint.kind.value, seconds)
        return CompiledConstraint(constraint, grammar, seconds)


def _admits_a_first_token(grammar: xgr.CompiledGrammar, vocab_size: int) -> bool:
    """Some token may open the output: else every logit of the first row would be masked, and nothing the
    sampler picks would be one the grammar accepts (a vocabulary without the bytes a pattern needs)."""
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    xgr.GrammarMatcher(grammar).fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, vocab_size)
    xgr.apply_token_bitmask_inplace(logits, bitmask)
    return bool(torch.isfinite(logits).any())

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


def _compile_with(compiler: xgr.GrammarCompiler, constraint: Constraint) -> xgr.CompiledGrammar:
    kind, spec = constraint.kind, constraint.spec
    if kind in (ConstraintKind.JSON_OBJECT, ConstraintKind.JSON_SCHEMA):
        schema = json.loads(ANY_OBJECT if kind is ConstraintKind.JSON_OBJECT else spec)
        strict = constraint.strict and kind is ConstraintKind.JSON_SCHEMA
        check_supported(schema, constraint.param, strict)
        # whitespace fixed to JSON's usual separators: a free-whitespace grammar lets small models loop on
        # newlines until max_tokens
        return compiler.compile_json_schema(json.dumps(searching_patterns(schema)), strict_mode=strict,
                                            any_whitespace=False, separators=(", ", ": "))
    if kind is ConstraintKind.REGEX:
        return compiler.compile_regex(spec)
    if kind is ConstraintKind.CHOICE:
        return compiler.compile_grammar(choice_grammar(spec))
    if kind is ConstraintKind.GRAMMAR:
        return compiler.compile_grammar(spec)
    return compiler.compile_structural_tag(spec)

