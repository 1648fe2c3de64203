"""The engine: requests in, one scheduled forward pass per step, token deltas and step records out."""

from __future__ import annotations

import gc
import itertools
from collections import Counter
import logging
import time
from dataclasses import replace
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from engine.kv_cache.block_manager import BlockManager
from engine.kv_cache.gpu_memory import plan_kv_pool
from engine.model.checkpoint import load_checkpoint, resolve_model
from engine.model.detokenizer import Detokenizer
from engine.engine_config import EngineConfig
from engine.errors import InvalidRequestError, ModelLoadError
from engine.idle_memory import return_free_heap
from engine.logprobs import TokenLogprob
from engine.model_runner import ModelRunner, StepTiming
from engine.outputs import DraftStep, GrammarStep, RequestOutput, RequestRecord, StepRecord
from engine.kv_cache.kv_groups import KvGroups, window_shape
from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
from engine.scheduling.request import FinishReason, Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduling.scheduler import ScheduleResult, Scheduler
from engine.speculation.ngram_drafter import NgramDrafter
from engine.speculation.speculator import Speculator
from engine.structured.drafted_grammar import row_grammars
from engine.structured.step_masks import StepMasks
from engine.slo_class import DEFAULT_CLASS, SloClass
from engine.model.tokenizer import Tokenizer, load_tokenizer
from policies import Knobs

if TYPE_CHECKING:
    from engine.structured.grammar_compiler import CompiledConstraint, GrammarCompiler

log = logging.getLogger(__name__)


def release_freed_memory() -> None:
    """Give the dequantized checkpoint's freed heap back to the OS (glibc keeps it otherwise)."""
    gc.collect()
    return_free_heap()

DEFAULT_MAX_MODEL_LEN = 8192   # unless max_model_len says otherwise: a longer limit only grows the RoPE tables and
                               # lets one request hold more of the KV pool than a small CPU pool has


def model_length_limit(requested: int | None, model_limit: int) -> int:
    """`max_model_len` in force: the one asked for, which the model must allow, else the model's own
    capped at DEFAULT_MAX_MODEL_LEN."""
    if requested is None:
        return min(DEFAULT_MAX_MODEL_LEN, model_limit)
    if not 0 < requested <= model_limit:
        raise ModelLoadError(f"max_model_len {requested} must be between 1 and the model's limit {model_limit}")
    return requested


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        dtype = config.torch_dtype()
        kind, location = resolve_model(config.model)
        checkpoint = load_checkpoint(config.model, dtype, config.seed, config.weights_mode(), config.quantized_max_rows,
                                     config.device)
        checkpoint.int8_activations = config.int8_activations()
        self.model_config = mc = checkpoint.config
        self.tokenizer: Tokenizer = load_tokenizer(kind, location, mc.vocab_size, mc.eos_token_ids, checkpoint.metadata)
        self.eos_token_ids = tuple(sorted(set(self.tokenizer.eos_token_ids) | set(mc.eos_token_ids)))
        self.max_model_len = model_length_limit(config.max_model_len, mc.max_position_embeddings)
        self.check_knobs(config.knobs)
        kv_dtype = config.kv_torch_dtype(dtype)
        on_gpu = config.device.startswith("cuda")
        sized_on_gpu = on_gpu and config.num_kv_blocks is None
        # with sliding layers a block is a page of one layer group's lanes (kv_groups.py): num_kv_blocks (blocks of
        # every layer) becomes as many pages as fill the same memory
        groups = KvGroups.for_model(mc, config.block_size) if config.hybrid_kv_cache else None
        pages_per_block = mc.num_layers // groups.lanes if groups else 1
        if sized_on_gpu:   # first a pool for the profiling step alone, then the one its measurement leaves room for
            num_blocks = self._blocks_for(self._profile_tokens()) * pages_per_block
        else:
            num_blocks = (config.num_kv_blocks or self._blocks_for_memory(kv_dtype)) * pages_per_block
        self.runner = ModelRunner(checkpoint, dtype, config.device, num_blocks, config.block_size,
                                  self.max_model_len, config.attention_backend, config.seed, kv_dtype, groups,
                                  config.logprobs_mode)
        del checkpoint
        release_freed_memory()
        if sized_on_gpu:
            num_blocks = self._size_gpu_pool()
        pool = PrefixCachingBlockManager if config.enable_prefix_caching else BlockManager
        self.block_manager = pool(num_blocks, config.block_size, self.runner.kv_groups)
        self.scheduler = Scheduler(self.block_manager, config.policy, config.knobs, shape=window_shape(mc))
        self.scheduler.speculator = Speculator(NgramDrafter(*config.ngram_sizes))
        if on_gpu and config.cuda_graphs:
            self.runner.capture_decode_graphs(num_blocks)   # no step runs more sequences than there are blocks
        self._grammars = None     # the GrammarCompiler, made on first use (engine/structured/)
        self.requests: dict[str, Request] = {}
        self._detokenizers: dict[str, Detokenizer] = {}
        self._prompt_logprobs: dict[str, list[TokenLogprob]] = {}   # scored so far, until the first output
        self._forks: dict[str, list[Request]] = {}    # forks held until their parent's prompt is computed
        self._ids = itertools.count()
        self._step = 0
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        self.arrival_listeners: list[Callable[[Request], None]] = []
        self.finish_listeners: list[Callable[[RequestRecord], None]] = []
        self.finished_by_reason: Counter[str] = Counter()
        log.info("engine ready: %s, %s, %d KV blocks of %d tokens in %s, max_model_len %d (the model's own: %d)",
                 mc.name, dtype, num_blocks, config.block_size, kv_dtype, self.max_model_len,
                 mc.max_position_embeddings)
        if self.runner.kv_groups is not None:
            g = self.runner.kv_groups
            log.info("KV blocks are pages of %d layers: %d global and %d sliding layer groups; a sliding group "
                     "gives its pages back as the %d-token window passes", g.lanes, g.num_full, g.num_sliding, g.window)

    def _profile_tokens(self) -> int:
        """The largest step the engine runs: a chunk of the top token budget, within one request's length."""
        return min(self.config.max_token_budget, self.max_model_len)

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _size_gpu_pool(self) -> int:
        """The pool from what gpu_memory_utilization leaves after a measured largest step (gpu_memory.py)."""
        tokens = self._profile_tokens()
        # logits for as many rows as the configured max_num_seqs (as vLLM's profiling run)
        plan = plan_kv_pool(self.runner, self.config.gpu_memory_utilization, tokens,
                            min(tokens, self.config.knobs.max_num_seqs),
                            self._peak_blocks(self.max_model_len))
        log.info("GPU memory: %s", plan.describe())
        self.runner.allocate_kv_cache(plan.num_blocks)
        return plan.num_blocks

    def _peak_blocks(self, num_tokens: int) -> int:
        """Blocks (pages, with layer groups) one request of `num_tokens` holds at most."""
        groups = self.runner.kv_groups
        return groups.peak_pages(num_tokens, self.config.max_token_budget) if groups else self._blocks_for(num_tokens)

    def _blocks_for_memory(self, kv_dtype: torch.dtype) -> int:
        bytes_per_block = self.model_config.kv_bytes_per_token * kv_dtype.itemsize * self.config.block_size
        return max(1, int(self.config.kv_cache_memory_mb * 2**20 // bytes_per_block))

    # -- requests --
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    slo: SloClass | None = None, cache_salt: str | None = None) -> str:
        return self.enqueue(self.make_request(prompt, params, request_id, arrival_time, slo, cache_salt))

    def make_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                     request_id: str | None = None, arrival_time: float | None = None,
                     slo: SloClass | None = None, cache_salt: str | None = None,
                     grammar: CompiledConstraint | None = None) -> Request:
        """Tokenize and validate; touches no engine state, so any thread may call it. `slo`: the
        request's SLO class (None: the default interactive targets); `cache_salt`: its tenant, whose
        cached prefix blocks no other salt reuses; `grammar`: the constraint its output is held to,
        compiled by `self.grammars` beforehand."""
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt)
        self._check_fits(ids, params)
        outside = [t for t, _ in params.logit_bias if t >= self.model_config.vocab_size]
        if outside:
            raise InvalidRequestError(f"logit_bias names token id {outside[0]}, outside the vocabulary "
                                      f"[0, {self.model_config.vocab_size})", "logit_bias")
        return Request(request_id or f"req-{next(self._ids)}", ids, params, arrival_time or time.monotonic(),
                       slo=slo or DEFAULT_CLASS, cache_salt=cache_salt,
                       grammar=_grammar_state(grammar))

    @property
    def grammars(self) -> GrammarCompiler:
        """Compiles constraints on its own worker thread, with an LRU cache (engine/structured/)."""
        if self._grammars is None:
            from engine.structured.grammar_compiler import GrammarCompiler
            self._grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids)
        return self._grammars

    def fork(self, request: Request, n: int) -> list[Request]:
        """`request` and n - 1 copies that follow it: queued, each copy waits until `request`'s prompt is
        computed, then finds its full blocks in the prefix cache and computes only what is past them (the
        last partial block), so the prompt is prefilled once (n > 1 and best_of). A seeded request's copy i
        draws with seed + i."""
        p = request.params
        copies = [Request(f"{request.request_id}-{i}", request.prompt_token_ids,
                          p if p.seed is None else replace(p, seed=p.seed + i), request.arrival_time,
                          slo=request.slo, cache_salt=request.cache_salt, follows=request.request_id,
                          grammar=request.grammar.copy() if request.grammar else None)
                  for i in range(1, n)]
        return [request, *copies]

    def enqueue(self, request: Request) -> str:
        """Queue a request made by make_request or fork (on the thread that steps the engine)."""
        request_id = request.request_id
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        self.requests[request_id] = request
        self._detokenizers[request_id] = Detokenizer(self.tokenizer, request.params.stop)
        parent = self.requests.get(request.follows) if request.follows else None
        if parent is not None and parent.num_output_tokens == 0 and not parent.is_finished:
            self._forks.setdefault(parent.request_id, []).append(request)
        else:
            self.scheduler.add(request)
        for listener in self.arrival_listeners:
            listener(request)
        return request_id

    def _encode_plain(self, text: str) -> list[int]:
        plain = getattr(self.tokenizer, "encode_plain", None)
        return plain(text) if plain is not None else self.tokenizer.encode(text)

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.model_config.vocab_size]
            if bad:
                raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary "
                                          f"[0, {self.model_config.vocab_size})", "prompt")
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids", "prompt")
        if not ids:
            raise InvalidRequestError("prompt is empty", "prompt")
        return ids

    def _check_fits(self, ids: list[int], params: SamplingParams) -> None:
        total = len(ids) + params.max_tokens
        if len(ids) >= self.max_model_len or total > self.max_model_len:
            raise InvalidRequestError(
                f"this model's maximum length is {self.max_model_len} tokens; the prompt has {len(ids)} "
                f"and max_tokens asks for {params.max_tokens} more", "max_tokens" if len(ids) < self.max_model_len
                else "prompt")
        # with sliding layers the peak depends on the chunks: those of the token budget now (a request admitted
        # under a smaller one than a later tuner's fits the pool in smaller chunks)
        needed = self.block_manager.peak_blocks(total, self.scheduler.latest_knobs.token_budget)
        if needed > self.block_manager.num_blocks:
            raise InvalidRequestError(f"the request needs {needed} KV blocks but the whole pool has "
                                      f"{self.block_manager.num_blocks}; lower max_tokens or the prompt", "max_tokens")

    def abort(self, request_id: str, reason: FinishReason = FinishReason.ABORT) -> bool:
        """Stop a request and free its KV (counted as `reason`: ERROR where the server failed it rather
        than the client leaving); False if it is unknown or already finished."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return False
        held = self._forks.get(request.follows or "", [])
        if any(fork is request for fork in held):   # never queued: only its place among the forks to give up
            held[:] = [fork for fork in held if fork is not request]
            self.scheduler.add(request)
        self._finish(request, reason)
        self._release_forks(request_id)
        self.requests.pop(request_id)
        self._detokenizers.pop(request_id)
        self._prompt_logprobs.pop(request_id, None)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def release_idle_memory(self) -> None:
        """Give back what only a running step needs (engine/idle_memory.py); for when no step runs."""
        if self.runner.quantized_path is not None:
            self.runner.quantized_path.kernels.drop_scratch()
        return_free_heap()

    def set_knobs(self, **changes) -> Knobs:
        """Validated now, applied at the next step boundary; the current knobs stay on error."""
        knobs = self.scheduler.knobs.replace(**changes)
        self.check_knobs(knobs)
        self.scheduler.set_knobs(knobs)
        return knobs

    def check_knobs(self, knobs: Knobs) -> None:
        if knobs.token_budget > self.config.max_token_budget:
            raise ValueError(f"knob token_budget={knobs.token_budget} is above this engine's max_token_budget "
                             f"{self.config.max_token_budget}, the top of the range it was sized for")

    def set_policy(self, name: str) -> None:
        self.scheduler.set_policy(name)

    # -- one step --
    def step(self, return_logits: bool = False) -> list[RequestOutput]:
        start = time.monotonic()
        shed = self._shed_expired(start)
        t0 = time.perf_counter()
        result = self.scheduler.schedule()
        schedule_s = time.perf_counter() - t0
        if not result.scheduled:
            return shed
        sampling = [s.request for s in result.scheduled if s.samples]
        masks = StepMasks([g for s in result.scheduled if s.samples
                           for g in row_grammars(s.request.grammar, s.request.draft_token_ids)],
                          self.model_config.vocab_size) if any(r.grammar is not None for r in sampling) else None
        try:
            out = self.runner.execute(result.scheduled, self._banned, return_logits, masks)
        except Exception:  # the step's requests fail; the engine and every other request go on
            log.exception("step %d failed; failing its %d requests", self._step, len(result.scheduled))
            return [self._fail(s.request) for s in result.scheduled]
        self.scheduler.commit(result, out.kept_drafts)
        self._test_undrafted(result, out.tokens)
        self.last_logits = out.logits
        for request_id, scored in out.prompt_logprobs.items():
            self._prompt_logprobs.setdefault(request_id, []).extend(scored)
        now = time.monotonic()
        self.scheduler.error_budget.observe(sampling, now)
        gaps = token_gaps(sampling, now)
        outputs = [self._append_or_fail(r, out.tokens[r.request_id], now, out.logprobs.get(r.request_id, ()))
                   for r in sampling]
        for r, o in zip(sampling, outputs):
            if len(o.token_ids) == len(o.new_token_ids) or r.is_finished:   # its prompt is in the KV: forks may go
                self._release_forks(r.request_id)
        grammar = GrammarStep(len(masks.rows) if masks else 0, out.timing.mask_s,
                              sum(max(0, len(o.new_token_ids) - 1) for r, o in zip(sampling, outputs)
                                  if r.grammar is not None))
        drafts = DraftStep(result.num_draft_tokens, sum(out.kept_drafts.values()), len(out.kept_drafts))
        self._emit_record(result, len(sampling), start, now - start, schedule_s, out.timing, gaps, grammar, drafts)
        return shed + outputs

    def _test_undrafted(self, result: ScheduleResult, tokens: dict[str, list[int]]) -> None:
        """Each decode offered a draft it did not verify: whether its sampled token is that draft."""
        speculator = self.scheduler.speculator
        if speculator is None:
            return
        for request_id, first in speculator.untested(result.scheduled):
            sampled = tokens.get(request_id)
            if sampled:
                speculator.observe(request_id, 1, int(sampled[0] == first), result.knobs)

    def _shed_expired(self, now: float) -> list[RequestOutput]:
        """End the queued requests admission gives up on (AdmissionControl.expired): each one's final
        output says `shed`, before any token of it was sent."""
        shed = []
        for request in self.scheduler.admission.expired(self.scheduler, now):
            shed.append(RequestOutput(request.request_id, [], "", "", [], request.num_prompt_tokens, True,
                                      FinishReason.SHED.value))
            self.abort(request.request_id, FinishReason.SHED)
        return shed

    def record_shed(self, request: Request, now: float) -> None:
        """A request refused at admission, never queued: it counts as an arrival (demand) and as a finished
        request that met no SLO, in every listener's books (on the thread that steps the engine)."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = FinishReason.SHED
        request.timings.finished = now
        self.finished_by_reason[FinishReason.SHED.value] += 1
        for listener in self.arrival_listeners:
            listener(request)
        record = request_record(request)
        for listener in self.finish_listeners:
            listener(record)

    def _release_forks(self, parent_id: str) -> None:
        for fork in self._forks.pop(parent_id, ()):
            self.scheduler.add(fork)

    def _append_or_fail(self, request: Request, tokens: list[int], now: float,
                        logprobs: list[TokenLogprob] | tuple = ()) -> RequestOutput:
        try:
            return self._append(request, tokens, now, logprobs)
        except Exception:
            log.exception("request %s failed while processing its output", request.request_id)
            return self._fail(request)

    def _fail(self, request: Request) -> RequestOutput:
        self._finish(request, FinishReason.ERROR)
        self._release_forks(request.request_id)
        return self._output(request, [])

    def _banned(self, request: Request, ahead: int = 0) -> tuple[int, ...]:
        """Tokens the request may not sample `ahead` positions past its outputs (a verified draft's rows)."""
        p = request.params
        if request.num_output_tokens + ahead >= p.min_tokens or request.grammar is not None:   # a grammar decides its end
            return ()
        return p.stop_token_ids + (() if p.ignore_eos else self.eos_token_ids)

    def _append(self, request: Request, tokens: list[int], now: float,
                logprobs: list[TokenLogprob] | tuple = ()) -> RequestOutput:
        """One emission: the sampled token (after verified drafts, the kept drafts and the sample after them),
        and the tokens its grammar forces after it (jump-forward). A stop ends it at the token that stops."""
        t = request.timings
        if t.first_token is None:
            t.first_token = now
            self.scheduler.admission.observe(request, now)
        t.token_times.append(now)
        detok = self._detokenizers[request.request_id]
        new: list[int] = []
        reason, taken = None, 0
        for i, token in enumerate(tokens):
            taken += 1
            request.output_token_ids.append(token)
            new.append(token)
            reason = self._stop_reason(request, token)
            if request.grammar is not None:
                reason, forced = self._follow_grammar(request, token, reason, last=i == len(tokens) - 1)
                new += forced
            if reason is not FinishReason.STOP:  # a stop token is not part of the text
                detok.add(request.output_token_ids)
            if detok.stopped:
                reason = FinishReason.STOP
            if reason is not None:
                break
        if reason is not None:
            self._finish(request, reason)
        return self._output(request, new, tuple(logprobs[:taken]))

    def _follow_grammar(self, request: Request, token: int, reason: FinishReason | None,
                        last: bool = True) -> tuple[FinishReason | None, list[int]]:
        """The grammar takes the sampled token; a complete grammar ends the request (even with ignore_eos);
        else, after the emission's last token, the tokens it forces next join the output at once, to be
        computed as one chunk."""
        grammar = request.grammar
        if not grammar.accept(token):
            raise RuntimeError(f"the grammar refused token {token}, which its mask allowed")
        if grammar.terminated:
            return FinishReason.STOP, []
        if reason is not None or not last or not self.config.jump_forward or request.params.logprobs is not None:
            return reason, []
        room = min(request.max_tokens - request.num_output_tokens, self.max_model_len - request.num_tokens)
        forced = grammar.forced_tokens(room, self._encode_plain)
        request.output_token_ids.extend(forced)
        if forced and (request.num_output_tokens >= request.max_tokens or request.num_tokens >= self.max_model_len):
            return FinishReason.LENGTH, forced
        return None, forced

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        p = request.params
        if request.num_output_tokens >= p.min_tokens and (
                token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids)):
            return FinishReason.STOP
        if request.num_output_tokens >= p.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, request: Request, reason: FinishReason) -> None:
        self.finished_by_reason[reason.value] += 1
        self.scheduler.finish(request, reason)
        if self.finish_listeners:
            record = request_record(request)
            for listener in self.finish_listeners:
                listener(record)

    def _output(self, request: Request, new_tokens: list[int],
                logprobs: tuple[TokenLogprob, ...] = ()) -> RequestOutput:
        detok = self._detokenizers[request.request_id]
        finished = request.status is RequestStatus.FINISHED
        delta = detok.delta(final=finished)
        scored = self._prompt_logprobs.pop(request.request_id, None) if request.scores_prompt else None
        if finished:  # the engine keeps no finished request: its caller has the final output
            self.requests.pop(request.request_id, None)
            self._detokenizers.pop(request.request_id, None)
            self._prompt_logprobs.pop(request.request_id, None)
        return RequestOutput(request.request_id, new_tokens, delta, detok.text, list(request.output_token_ids),
                             request.num_prompt_tokens, finished,
                             request.finish_reason.value if request.finish_reason else None,
                             request.cache.cached_tokens, logprobs, None if scored is None else tuple(scored))

    def _emit_record(self, result: ScheduleResult, num_sampled: int, start: float, duration: float,
                     schedule_s: float, timing: StepTiming, gaps: tuple[float, ...], grammar: GrammarStep,
                     drafts: DraftStep) -> None:
        record = step_record(self._step, result, self.scheduler, num_sampled, start, duration, schedule_s, timing,
                             gaps, grammar, drafts)
        self._step += 1
        self.last_record = record
        for listener in self.step_listeners:
            listener(record)


def _grammar_state(compiled: CompiledConstraint | None):
    if compiled is None:
        return None
    from engine.structured.grammar_state import GrammarState
    return GrammarState(compiled)


def token_gaps(sampling: list[Request], now: float) -> tuple[float, ...]:
    """Time since each request's previous token, for those that already have one (TBT)."""
    return tuple(now - r.timings.token_times[-1] for r in sampling if r.timings.token_times)


def step_record(step: int, result: ScheduleResult, scheduler: Scheduler, num_sampled: int, start: float,
                duration: float, schedule_s: float, timing: StepTiming, gaps: tuple[float, ...] = (),
                grammar: GrammarStep = GrammarStep(), drafts: DraftStep = DraftStep()) -> StepRecord:
    """The step's facts for telemetry (shared with the simulator, which predicts `timing`). A verifying
    decode counts as its decode rows (the drafted tokens among the decode tokens)."""
    decodes = result.num_decode_tokens
    return StepRecord(
        step=step, start=start, duration_s=duration, num_prefill_tokens=result.num_tokens - decodes,
        num_decode_tokens=decodes, num_prefill_seqs=(result.num_rows or len(result.scheduled)) - decodes,
        num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
        num_preempted=result.num_preempted, kv_usage=scheduler.blocks.usage,
        context_tokens=result.context_tokens, attended_pairs=result.attended_pairs, num_sampled=num_sampled,
        prepare_s=timing.prepare_s, forward_s=timing.forward_s, sample_s=timing.sample_s,
        schedule_s=schedule_s, policy=result.policy, knobs_version=result.knobs.version, token_gaps=gaps,
        prefix_cache_queries=result.cache.queries, prefix_cache_hits=result.cache.hits,
        prefix_cache_evictions=result.cache.evictions, prefix_cache_blocks=result.cache.cached_blocks,
        head_rows=result.num_sampled, grammar_rows=grammar.rows, mask_s=grammar.mask_s,
        forced_tokens=grammar.forced_tokens, draft_tokens=drafts.drafted, kept_draft_tokens=drafts.kept,
        draft_seqs=drafts.seqs)


def request_record(request: Request) -> RequestRecord:
    """A finished request's timings and sizes for telemetry."""
    t = request.timings
    return RequestRecord(request.request_id, t.arrival, t.first_token, t.finished, tuple(t.token_times),
                         request.num_prompt_tokens, request.num_output_tokens, request.params.max_tokens,
                         request.finish_reason.value, request.num_preemptions, request.slo.name, request.slo.ttft_s,
                         request.slo.tbt_s, request.cache.cached_tokens, request.grammar is not None)
