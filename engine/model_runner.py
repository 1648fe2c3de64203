"""Turns a scheduled step into one flattened forward pass over the paged KV cache, then samples."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.attention.backends import TorchAttention, make_attention_backend, prepare_grouped_step, prepare_step
from engine.attention.batch_layout import BatchLayout
from engine.attention.rope import RotaryEmbedding
from engine.kv_cache.kv_groups import KvGroups
from engine.model.checkpoint import Checkpoint, fuse_projections, fuse_quantized
from engine.model.cpu_decode import CpuDecodeLayers
from engine.model.transformer import LlamaForCausalLM, local_rotary
from engine.kernels.quantized_linear import (QuantizedEmbedding, QuantizedLinear, QuantizedPath, QuantizedTensor, QuantKernels,
                                     load_kernels, measure_crossover)
from engine.logit_rows import LogitRows, plan_logit_rows
from engine.logprobs import TokenLogprob, token_logprobs
from engine.sampler import Sampler, SampleRow
from engine.structured.step_masks import StepMasks
from engine.scheduling.request import Request
from engine.scheduling.scheduler import ScheduledRequest
from engine.speculation.verification import kept_drafts, layout_rows

if TYPE_CHECKING:
    from engine.decode_graphs import DecodeGraphs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepTiming:
    prepare_s: float
    forward_s: float
    sample_s: float
    mask_s: float = 0.0           # grammar masks filled (on a worker, during the forward pass)


@dataclass(frozen=True)
class StepOutput:
    tokens: dict[str, list[int]]  # request_id -> its new tokens (one; after verified drafts, 1 + those kept)
    logits: torch.Tensor | None   # [sampling rows, vocab] when asked for (tests)
    timing: StepTiming
    logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)    # one per new token, where asked
    prompt_logprobs: dict[str, list[TokenLogprob]] = field(default_factory=dict)   # this step's prompt positions
    kept_drafts: dict[str, int] = field(default_factory=dict)   # verifying decodes: drafted tokens kept


class ModelRunner:
    def __init__(self, checkpoint: Checkpoint, dtype: torch.dtype, device: str, num_blocks: int,
                 block_size: int, max_model_len: int, attention_backend: str = "auto", seed: int = 0,
                 kv_dtype: torch.dtype | None = None, kv_groups: KvGroups | None = None,
                 logprobs_mode: str = "raw") -> None:
        self.config = checkpoint.config
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.model, self.quantized_path = build_model(checkpoint, dtype, self.device, max_model_len)
        c = self.config
        self.kv_dtype = kv_dtype or dtype
        # sliding-window layers: the KV in pages per layer group, the sliding ones given back as windows pass
        self.kv_groups = kv_groups
        self.model.kv_layer_slots = self.kv_groups.layer_slots if self.kv_groups else None
        self.allocate_kv_cache(num_blocks)
        self.attention = make_attention_backend(attention_backend, c.attention_scale, self.device.type, dtype)
        if c.window is not None and not isinstance(self.attention, TorchAttention):
            log.warning("attention backend %r has no sliding window: %s runs on the torch backend",
                        self.attention.name, c.name)
            self.attention = TorchAttention(c.attention_scale)
        self.sampler = Sampler(seed, self.device, logprobs_mode)
        self.decode_graphs: DecodeGraphs | None = None

    @property
    def kv_lanes(self) -> int:
        """Layers per block: all of them, or a layer group's (kv_groups.py)."""
        return self.kv_groups.lanes if self.kv_groups else self.config.num_layers

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """A zeroed pool of `num_blocks` blocks, replacing any earlier one (freed first)."""
        self.kv_cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.kv_cache = self._kv_tensor(num_blocks)

    def _kv_tensor(self, num_blocks: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """[lanes, 2 (K, V), slots, kv_heads, head_dim]; a layer reads its lane (its index without groups)."""
        c = self.config
        return torch.zeros(self.kv_lanes, 2, num_blocks * self.block_size, c.num_kv_heads, c.head_dim,
                           dtype=dtype or self.kv_dtype, device=self.device)

    def _step_metadata(self, layout: BatchLayout, group_tables: list[list[list[int]]] | None = None):
        """The attention metadata of a step laid out as `layout` (group 0's tables), and with layer groups
        each group's from its tables (per group, per sequence; NULL pages never read, given slot 0)."""
        if self.kv_groups is None:
            return prepare_step(self.attention, layout, self.device, self.config.window)
        layouts = [layout] + [replace(layout, block_tables=[np.maximum(np.asarray(t, dtype=np.int64), 0)
                                                            for t in group]) for group in group_tables]
        g = self.kv_groups
        return prepare_grouped_step(self.attention, layouts, self.device,
                                    [g.window if sliding else None for sliding in g.group_sliding])

    def _one_sequence(self, num_tokens: int, shared: bool = False) -> tuple[BatchLayout, list[list[list[int]]] | None]:
        """One sequence of `num_tokens` from position 0 on the first pages: its layout and, with layer groups,
        the other groups' tables (each on pages of its own, or with `shared` on group 0's)."""
        bs, groups = self.block_size, self.kv_groups
        blocks = -(-num_tokens // bs)
        layout = BatchLayout(num_decodes=0, query_lens=np.array([num_tokens]), context_lens=np.array([0]),
                             block_tables=[np.arange(blocks)], block_size=bs)
        if groups is None:
            return layout, None
        first = (lambda g: 0) if shared else (lambda g: g * blocks)
        return layout, [[list(range(first(g), first(g) + blocks))] for g in range(1, groups.num_groups)]

    def capture_decode_graphs(self, max_batch: int) -> None:
        """CUDA graphs for decode-only steps of up to `max_batch` sequences (decode_graphs.py), where the
        attention backend reads its inputs from the device (Triton) and no layer attends to a window."""
        if self.attention.name != "triton" or self.config.window is not None:
            log.info("no CUDA graphs: the %s attention backend%s runs every step eagerly", self.attention.name,
                     " (a sliding-window model)" if self.config.window is not None else "")
            return
        from engine.decode_graphs import DecodeGraphs   # imports triton, which only a CUDA engine needs

        self.decode_graphs = DecodeGraphs(self.model, self.attention, self.kv_cache, self.block_size,
                                          self.max_model_len, max_batch)
        self.decode_graphs.capture()

    @torch.inference_mode()
    def profile_step(self, num_tokens: int, num_sampled: int) -> None:
        """One prefill chunk of `num_tokens` (from position 0, into the pool's first blocks) with logits for
        its last `num_sampled` rows: the largest step the engine runs, for its activation peak."""
        layout, tables = self._one_sequence(num_tokens, shared=True)   # only the memory peak counts here
        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        self.model(to(np.zeros(num_tokens, dtype=np.int64)), to(layout.positions()),
                   to(np.arange(num_tokens - num_sampled, num_tokens)), self.attention, self.kv_cache,
                   self._step_metadata(layout, tables))

    @property
    def weights(self) -> str:
        """What the linear layers run on: `quantized` (the GGUF's blocks, with the kernels for steps of
        up to `quantized_max_rows` rows; `quantized-int8` with int8 activations) or `dense`."""
        if not self.quantized_path:
            return "dense"
        return "quantized-int8" if self.quantized_path.int8 else "quantized"

    @property
    def quantized_max_rows(self) -> int:
        """Steps of up to this many rows (tokens) run on the quantized kernels; 0 without them."""
        return self.quantized_path.max_rows if self.quantized_path else 0

    def stored_linear_bytes(self) -> int:
        """Bytes of the linear layers' weights (LM head included) as the model holds them."""
        seen, total = set(), 0
        for module in self.model.modules():
            if isinstance(module, QuantizedLinear):
                total += module.nbytes
            elif isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
                seen.add(id(module.weight))
                total += module.weight.nbytes
        return total

    def set_quantized_max_rows(self, rows: int) -> None:
        """Move the crossover: steps of up to `rows` rows on the kernels (0: every step dense), as a
        calibration of this model on this machine measured it."""
        if self.quantized_path:
            self.quantized_path.max_rows = rows

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest], banned: Banned | None = None,
                return_logits: bool = False, masks: StepMasks | None = None) -> StepOutput:
        """Run one step. `banned(request, j)`: the tokens a sampling request may not pick at its j-th row
        (min_tokens); `masks`: the grammar masks of the sampling rows (engine.speculation.verification's
        order), being filled while the forward runs."""
        t0 = time.perf_counter()
        seqs, sampling = layout_rows(scheduled)
        layout, input_ids = self._prepare(seqs)
        sampling = np.array(sampling, dtype=np.int64)
        graphs = self.decode_graphs if self.decode_graphs is not None and self.decode_graphs.runs(layout) else None
        if graphs is None:
            meta = self._step_metadata(layout, [list(t) for t in zip(*(s.request.group_tables for s in seqs))]
                                       if self.kv_groups else None)
            to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
            rows = plan_logit_rows(seqs, layout.query_starts, sampling)
        t1 = time.perf_counter()
        if graphs is not None:
            logits = graphs.replay(input_ids, layout)
            if len(sampling) < layout.num_seqs:
                logits = logits[torch.from_numpy(sampling).to(self.device)]
            rows = None
        else:
            logits = self.model(to(input_ids), to(layout.positions()), to(rows.positions),
                                self.attention, self.kv_cache, meta)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)   # kernels run asynchronously: forward_s times them to the end
        t2 = time.perf_counter()
        prompt_logprobs = self._prompt_logprobs(logits, rows, seqs) if rows and rows.prompt_spans else {}
        if rows is not None and rows.prompt_spans:
            logits = logits[torch.from_numpy(rows.sample_rows).to(self.device)]
        filled = masks.result() if masks is not None else None
        picked = self.sampler.sample(logits.clone() if return_logits else logits,
                                     sample_rows(scheduled, banned), filled)
        t3 = time.perf_counter()
        tokens, logprobs, kept = verified(scheduled, picked.tokens, picked.logprobs)
        return StepOutput(tokens, logits.cpu() if return_logits else None,
                          StepTiming(t1 - t0, t2 - t1, t3 - t2, filled.fill_s if filled else 0.0), logprobs,
                          prompt_logprobs, kept)

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor, rows: LogitRows,
                         scheduled: list[ScheduledRequest]) -> dict[str, list[TokenLogprob]]:
        """Each asking request's logprobs of the prompt tokens this step's positions score."""
        found = {}
        for span in rows.prompt_spans:
            request = scheduled[span.request_index].request
            part = logits[span.first_row:span.first_row + len(span.targets)]
            targets = torch.tensor(span.targets, device=logits.device, dtype=torch.long)
            found[request.request_id] = token_logprobs(torch.log_softmax(part.float(), dim=-1), targets,
                                                       [request.params.prompt_logprobs] * len(span.targets))
        return found

    @torch.inference_mode()
    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """fp32 logits at every position of one prompt in one forward pass (perplexity), on a KV cache of
        its own: the engine's pool, its blocks and its prefix cache are not touched."""
        n = len(token_ids)
        layout, tables = self._one_sequence(n)
        pages = len(layout.block_tables[0]) * (1 + len(tables or ()))
        to = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return self.model(to(np.asarray(token_ids, dtype=np.int64)), to(layout.positions()),
                          to(np.arange(n, dtype=np.int64)), self.attention, self._kv_tensor(pages, self.dtype),
                          self._step_metadata(layout, tables)).cpu()

    def _prepare(self, scheduled: list[ScheduledRequest]) -> tuple[BatchLayout, np.ndarray]:
        """The layout of the step's sequences (layout_rows: a verifying decode as its decode rows) and its
        input tokens."""
        num_decodes = sum(1 for s in scheduled if s.is_decode)
        input_ids = np.fromiter((t for s in scheduled for t in s.request.token_ids(s.context_len,
                                 s.context_len + s.num_tokens)), dtype=np.int64)
        layout = BatchLayout(
            num_decodes=num_decodes,
            query_lens=np.array([s.num_tokens for s in scheduled], dtype=np.int64),
            context_lens=np.array([s.context_len for s in scheduled], dtype=np.int64),
            block_tables=[np.asarray(s.request.block_table, dtype=np.int64) for s in scheduled],
            block_size=self.block_size,
        )
        return layout, input_ids


Banned = Callable[[Request, int], tuple[int, ...]]


def sample_rows(scheduled: list[ScheduledRequest], banned: Banned | None) -> list[SampleRow]:
    """One SampleRow per sampling row: a verifying decode's row j as output position num_output + j, its
    drafts before j counted as its outputs (penalties) and its bans those of that position."""
    rows = []
    for s in scheduled:
        if not s.samples:
            continue
        r = s.request
        for j in range(s.num_drafts + 1):
            output = r.output_token_ids + r.draft_token_ids[:j] if j else r.output_token_ids
            rows.append(SampleRow(r.request_id, r.params, banned(r, j) if banned else (), r.prompt_token_ids,
                                  output, r.num_output_tokens + j))
    return rows


def verified(scheduled: list[ScheduledRequest], sampled: list[int], logprobs: list[TokenLogprob | None]
             ) -> tuple[dict[str, list[int]], dict[str, list[TokenLogprob]], dict[str, int]]:
    """Each sampling request's new tokens (engine/speculation/verification.py), their logprobs where asked,
    and for verifying decodes the drafted tokens kept."""
    tokens, found, kept = {}, {}, {}
    i = 0
    for s in scheduled:
        if not s.samples:
            continue
        rid, n = s.request.request_id, s.num_drafts + 1
        row_tokens, row_logprobs = sampled[i:i + n], logprobs[i:i + n]
        i += n
        if s.num_drafts:
            kept[rid] = kept_drafts(s.request.draft_token_ids, row_tokens)
            n = kept[rid] + 1
        tokens[rid] = row_tokens[:n]
        if row_logprobs[0] is not None:
            found[rid] = row_logprobs[:n]
    return tokens, found, kept


def build_model(checkpoint: Checkpoint, dtype: torch.dtype, device: torch.device,
                max_positions: int) -> tuple[LlamaForCausalLM, QuantizedPath | None]:
    """Build on the meta device (no wasted init), then take the checkpoint's tensors as parameters; modules
    whose weights the checkpoint keeps quantized become QuantizedLinear / QuantizedEmbedding, sharing
    the returned path (None when every weight is dense)."""
    rotary = RotaryEmbedding(checkpoint.config, max_positions).to(device)
    local = local_rotary(checkpoint.config, max_positions)
    with torch.device("meta"):
        model = LlamaForCausalLM(checkpoint.config, rotary, local.to(device) if local is not None else None)
    gemma = checkpoint.config.family == "gemma3"
    # Gemma's norm weights (1 + w) stay fp32: transformers scales by 1 + w in fp32, whatever the model's dtype
    state = {k: v.to(device=device, dtype=torch.float32 if gemma and k.endswith("norm.weight") else dtype)
             for k, v in fuse_projections(checkpoint.state_dict, checkpoint.config).items()}
    path = install_quantized(model, checkpoint, state, dtype) if checkpoint.quantized else None
    tied = checkpoint.config.tie_word_embeddings and "model.embed_tokens.weight" in state
    if tied:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    if path is not None and device.type == "cpu":
        model.decode_layers = CpuDecodeLayers.build(model)
    return model.eval(), path


def interleaved_once(kernels: QuantKernels, tensor: QuantizedTensor, done: dict[int, QuantizedTensor]) -> QuantizedTensor:
    """tensor interleaved (once, however many modules share it) where the layout exists for it."""
    if not tensor.interleavable:
        return tensor
    if id(tensor) not in done:
        done[id(tensor)] = kernels.interleave(tensor)
    return done[id(tensor)]


def log_kernel_layouts(kernels: QuantKernels, parts: list[QuantizedTensor], int8: bool) -> None:
    """One line: which types run on which kernels (interleaved rows with which instructions, or GGUF's layout)
    and with which activations."""
    isa = "AVX-512 VNNI" if kernels.avx512 else "AVX2" if kernels.avx2 else "portable C"

    def how(p: QuantizedTensor) -> str:
        if not p.interleaved:
            return "GGUF layout, int16 activations"
        narrow = int8 and kernels.avx512 and p.type_name != "Q8_0"   # qlinear_x16.c's int8 kernels
        return f"interleaved x16, {isa}, {'int8' if narrow else 'int16'} activations"
    layouts = Counter((p.type_name, how(p)) for p in parts)
    log.info("quantized linear layers: %s", ", ".join(f"{t} x{n} on {h}" for (t, h), n in sorted(layouts.items())))


def merge_same_type(parts: list[QuantizedTensor]) -> list[QuantizedTensor]:
    """Neighbouring parts of one type and layout as one tensor: their rows simply follow each other, and
    a step then quantizes its activations once and calls the kernel once for a fused q/k/v or gate/up."""
    merged = [parts[0]]
    for part in parts[1:]:
        last = merged[-1]
        if (part.qtype, part.interleaved, part.cols) == (last.qtype, last.interleaved, last.cols):
            merged[-1] = QuantizedTensor(last.qtype, last.rows + part.rows, last.cols, torch.cat([last.data, part.data]),
                                         f"{last.name}+{part.name}", last.interleaved)
        else:
            merged.append(part)
    return merged


def install_quantized(model: LlamaForCausalLM, checkpoint: Checkpoint, state: dict[str, torch.Tensor],
                      dtype: torch.dtype) -> QuantizedPath:
    """Swap in the quantized modules (taking their biases out of `state`), then size their row limit."""
    path = QuantizedPath(load_kernels(), int8=checkpoint.int8_activations)
    linears: dict[str, QuantizedLinear] = {}
    interleaved: dict[int, QuantizedTensor] = {}   # a tied LM head and the embeddings share one tensor
    fused = fuse_quantized(checkpoint.quantized, checkpoint.config)
    # the embeddings last: they take the head's interleaved rows where tied, else stay in GGUF's layout, mapped
    # from the file (a lookup dequantizes a few rows either way, and an untied table is never multiplied)
    for name, parts in sorted(fused.items(), key=lambda item: item[0] == "model.embed_tokens"):
        if name == "model.embed_tokens":
            parts = [interleaved.get(id(p), p) for p in parts]
        elif path.kernels.avx2:   # rows interleaved in groups of 16, faster at every row count (engine/kernels/csrc/qlinear_x16.c)
            parts = [interleaved_once(path.kernels, p, interleaved) for p in parts]
        parts = merge_same_type(parts)
        parent, _, attr = name.rpartition(".")
        if attr == "embed_tokens":
            module = QuantizedEmbedding(parts[0], path, dtype)
        else:
            module = QuantizedLinear(parts, state.pop(name + ".bias", None), path, dtype)
            linears[name] = module
        setattr(model.get_submodule(parent) if parent else model, attr, module)
    log_kernel_layouts(path.kernels, [p for m in linears.values() for p in m.parts], path.int8)
    if checkpoint.quantized_max_rows is not None:
        path.max_rows = checkpoint.quantized_max_rows
    elif linears:
        # the layers' largest matrix (fused gate/up) stands for all: its crossover is where the model's is
        layers = [m for n, m in linears.items() if n.startswith("model.layers.")] or list(linears.values())
        crossover = measure_crossover(max(layers, key=lambda m: m.nbytes))
        path.max_rows, path.measured = crossover.max_rows, True
        gemm = "bf16" if path.dense_dtype == torch.bfloat16 else "fp32"
        log.info("quantized kernels for steps of up to %d rows, dequantize + %s GEMM above (measured: %s)",
                 crossover.max_rows, gemm, ", ".join(f"{n} rows {crossover.quantized_s[n] * 1e3:.2f}/"
                                                     f"{crossover.dense_s[n] * 1e3:.2f} ms" for n in crossover.dense_s))
    return path
