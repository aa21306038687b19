"""CUDA graphs for decode steps (as vLLM does): one graph per padded batch size.

A decode step launches hundreds of small kernels; replaying a captured graph removes the
Python and launch overhead that dominates at small batch. Graphs read their inputs from static
buffers that each step refills; a batch is padded up to the next captured size with padding
tokens (slot -1: not written to the cache; seq_len 1: a one-key attention whose result is
dropped). The attention ops are graph-safe: no host sync, no allocation, fixed launch shapes for a
given bound on the sequence length (``max_seq_len_to_capture``, capped at max_model_len).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend


def capture_sizes(max_num_seqs: int) -> List[int]:
    sizes = [1, 2, 4] + list(range(8, 513, 8))
    return [s for s in sizes if s <= max_num_seqs] or [1]


class CudaGraphRunner:
    def __init__(self, runner: Any, max_num_seqs: int) -> None:
        self.runner = runner
        self.batch_sizes = capture_sizes(max_num_seqs)
        self.max_len = min(runner.max_model_len, runner.cfg.max_seq_len_to_capture)
        max_bs, dev = self.batch_sizes[-1], runner.device
        width = -(-self.max_len // runner.block_size)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.zeros(1, dtype=torch.int32, device=dev)
        self.block_tables = torch.zeros(max_bs, width, dtype=torch.int32, device=dev)
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0  # decode steps served by a graph (tests and logs read it)
        self._capture_all()

    def _backend(self, bs: int) -> PagedAttentionBackend:
        r = self.runner
        backend = PagedAttentionBackend(r.kv_caches, r.mc.num_attention_heads, r.num_kv_heads,
                                        r.head_dim, r.block_size)
        backend.set_metadata(AttentionMetadata(
            num_prefills=0, num_prefill_tokens=0, num_decode_tokens=bs,
            slot_mapping=self.slot_mapping[:bs], seq_lens=self.seq_lens[:bs],
            query_start_loc=self.query_start_loc, block_tables=self.block_tables[:bs],
            max_query_len=1, max_decode_seq_len=self.max_len))
        return backend

    @torch.inference_mode()
    def _capture_all(self) -> None:
        model, pool = self.runner.model, None
        # Largest first, so smaller graphs reuse the memory pool of the larger ones.
        for bs in reversed(self.batch_sizes):
            backend = self._backend(bs)
            ids, pos = self.input_ids[:bs], self.positions[:bs]
            model.forward(ids, pos, backend)  # warm-up: lazy inits must not happen in capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = model.forward(ids, pos, backend)
            pool = graph.pool()
            self.graphs[bs] = (graph, out)
        torch.cuda.synchronize()

    def can_run(self, num_seqs: int, max_seq_len: int) -> bool:
        return num_seqs <= self.batch_sizes[-1] and max_seq_len <= self.max_len

    def run(self, plan: Any) -> torch.Tensor:
        n = int(plan.num_seqs)
        bs = next(s for s in self.batch_sizes if s >= n)
        seq_lens = np.asarray(plan.seq_lens[:n])
        width = max(1, -(-int(seq_lens.max()) // self.runner.block_size))
        _fill(self.input_ids, plan.input_ids[:n], bs, 0)
        _fill(self.positions, plan.positions[:n], bs, 0)
        _fill(self.slot_mapping, plan.slot_mapping[:n], bs, -1)
        _fill(self.seq_lens, seq_lens, bs, 1)
        self.block_tables[:n, :width].copy_(
            torch.from_numpy(np.ascontiguousarray(plan.block_tables[:n, :width])),
            non_blocking=True)
        graph, out = self.graphs[bs]
        graph.replay()
        self.num_replays += 1
        return out[:n]


def _fill(dst: torch.Tensor, src: Any, bs: int, pad: int) -> None:
    n = len(src)
    dst[:n].copy_(torch.from_numpy(np.ascontiguousarray(src)).to(dst.dtype), non_blocking=True)
    if bs > n:
        dst[n:bs].fill_(pad)
