"""CUDA graphs for decode-only steps: the whole forward pass captured once per batch size, then replayed.

A decode step of an 8B model is ~100 small kernel launches per layer group that the GPU finishes faster
than Python issues them; a replayed graph issues them all at once. Graphs are captured at start-up for a
ladder of batch sizes (as vLLM does); a step of b sequences replays the smallest graph of at least b,
its extra rows padded (slot -1: their K/V are not written; one key of block 0 read, whatever is there).
Inputs live in static buffers the graphs read; a step copies its own values in before the replay.
Larger steps and steps with prefill chunks run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.attention.batch_layout import BatchLayout
from engine.attention.triton_attention import TritonAttentionMetadata, pad_block_tables
from engine.model.transformer import LlamaForCausalLM

log = logging.getLogger(__name__)

# batch sizes captured: every step up to the largest pads to at most 1.33x its sequences (vLLM's ladder is alike)
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


@dataclass
class StaticInputs:
    """The buffers every graph reads, sized for the largest batch; graph b reads their first b rows."""
    input_ids: torch.Tensor       # [B] int64
    positions: torch.Tensor       # [B] int64
    logits_indices: torch.Tensor  # [B] int64: 0..B-1, every decode samples
    slot_mapping: torch.Tensor    # [B] int32, -1 for padding rows
    block_tables: torch.Tensor    # [B, blocks per max_model_len] int32
    seq_lens: torch.Tensor        # [B] int32
    zeros: torch.Tensor           # [B] int32: the prefill fields, which a decode-only step does not read

    @classmethod
    def allocate(cls, batch: int, max_blocks: int, device: torch.device) -> "StaticInputs":
        i32 = dict(dtype=torch.int32, device=device)
        return cls(torch.zeros(batch, dtype=torch.long, device=device), torch.zeros(batch, dtype=torch.long, device=device),
                   torch.arange(batch, device=device), torch.full((batch,), -1, **i32),
                   torch.zeros(batch, max_blocks, **i32), torch.ones(batch, **i32), torch.zeros(batch, **i32))

    def metadata(self, batch: int, block_size: int) -> TritonAttentionMetadata:
        z = self.zeros[:batch]
        return TritonAttentionMetadata(self.slot_mapping[:batch], self.block_tables[:batch], self.seq_lens[:batch],
                                       z, z, z, num_decodes=batch, num_prefills=0, max_query_len=0,
                                       block_size=block_size)


class DecodeGraphs:
    def __init__(self, model: LlamaForCausalLM, attention, kv_cache: torch.Tensor, block_size: int,
                 max_model_len: int, max_batch: int) -> None:
        self.model, self.attention, self.kv_cache, self.block_size = model, attention, kv_cache, block_size
        self.sizes = [b for b in GRAPH_BATCH_SIZES if b <= max_batch]
        self.max_blocks = -(-max_model_len // block_size)
        self.inputs = StaticInputs.allocate(self.sizes[-1], self.max_blocks, kv_cache.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}   # batch size -> its graph, whose output is outputs[batch]
        self.outputs: dict[int, torch.Tensor] = {}

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, all in one memory pool: the smaller graphs reuse the largest one's activations."""
        start, before = time.perf_counter(), self._allocated()
        pool = None
        for batch in reversed(self.sizes):
            self.graphs[batch], self.outputs[batch], pool = self._capture_one(batch, pool)
        log.info("CUDA graphs captured for decode steps of %s sequences in %.1f s (%.0f MiB)",
                 "/".join(map(str, self.sizes)), time.perf_counter() - start, (self._allocated() - before) / 2**20)

    def _capture_one(self, batch: int, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, object]:
        """(graph, its output, the pool) for steps of `batch` sequences."""
        self._forward(batch)   # compiles the Triton kernels for this shape and warms cuBLAS up
        torch.cuda.synchronize(self.kv_cache.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            output = self._forward(batch)
        torch.cuda.synchronize(self.kv_cache.device)
        return graph, output, graph.pool()

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.kv_cache.device) if self.kv_cache.is_cuda else 0

    def _forward(self, batch: int) -> torch.Tensor:
        s = self.inputs
        return self.model(s.input_ids[:batch], s.positions[:batch], s.logits_indices[:batch], self.attention,
                          self.kv_cache, s.metadata(batch, self.block_size))

    def runs(self, layout: BatchLayout) -> bool:
        """A step a graph can replay: decodes only (one token each), no more than the largest graph."""
        return (layout.num_decodes == layout.num_seqs == layout.num_tokens <= self.sizes[-1]
                and max(len(t) for t in layout.block_tables) <= self.max_blocks)

    def replay(self, input_ids: np.ndarray, layout: BatchLayout) -> torch.Tensor:
        """The step's logits [sequences, vocab] (a view of the graph's output, valid until the next replay)."""
        n = layout.num_seqs
        batch = self.sizes[bisect.bisect_left(self.sizes, n)]
        s = self.inputs
        host = lambda a, dtype: torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))  # noqa: E731
        s.input_ids[:n].copy_(host(input_ids, np.int64))
        s.positions[:n].copy_(host(layout.context_lens, np.int64))
        tables = pad_block_tables(layout.block_tables)
        s.block_tables[:n, :tables.shape[1]].copy_(host(tables, np.int32))
        s.seq_lens[:n].copy_(host(layout.seq_lens, np.int32))
        s.slot_mapping[:n].copy_(host(layout.slot_mapping(), np.int32))
        if batch > n:   # padding rows: no K/V written, one key read
            s.slot_mapping[n:batch].fill_(-1)
            s.seq_lens[n:batch].fill_(1)
        self.graphs[batch].replay()
        return self.outputs[batch][:n]
