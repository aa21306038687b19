"""CUDA graphs for speculative verification steps (n-gram speculation on CUDA).

A verification step feeds each speculating sequence's last token and its k drafts (an extend
query of k+1 tokens), so the decode graphs (one query token per sequence) cannot run it, and
eagerly it would pay the Python and launch overhead that graphs remove: at batch 1 that overhead
costs more than speculation saves. These graphs run steps in which no entry feeds more than
Q = num_speculative_tokens + 1 tokens (decodes with or without drafts, short prompt chunks):
each entry is padded to Q query tokens, the batch to a captured size. A padding token sits
after its entry's real tokens (causal attention: no real token sees it), is not written to the
cache (slot -1), and reuses its entry's last position (within the rotary tables); a padding
entry is a Q-token query with no context. The model's hidden rows come back in the plan's token
order.

The extend kernel is graph-safe like the decode ones: no host sync, no allocation, a launch
shape fixed by the token count and Q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

from pagedkv.engine.cuda_graph import _gc_paused, _mirrored, destroy_graphs
from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend


def verify_batch_sizes(max_num_seqs: int) -> List[int]:
    return [s for s in (1, 2, 4, 8, 16, 32) if s <= max_num_seqs] or [1]


class VerifyGraphRunner:
    def __init__(self, runner: Any, max_num_seqs: int, num_speculative_tokens: int) -> None:
        self.model = runner.model
        self.kv_caches = runner.kv_caches
        self.num_heads, self.num_kv_heads = runner.num_heads, runner.num_kv_heads
        self.head_dim, self.block_size = runner.head_dim, runner.block_size
        self.kv_cache_dtype = runner.kv_cache_dtype
        self.q = num_speculative_tokens + 1
        self.batch_sizes = verify_batch_sizes(max_num_seqs)
        self.max_len = min(runner.max_model_len, runner.cfg.max_seq_len_to_capture)
        max_bs, dev, q = self.batch_sizes[-1], runner.device, self.q
        width = -(-self.max_len // self.block_size)
        self._host64, self._dev64 = _mirrored((3, max_bs * q), torch.int64, dev)
        self.input_ids, self.positions, self.slot_mapping = self._dev64.unbind(0)
        self._host64[2] = -1
        self._host32, self._dev32 = _mirrored((2 * max_bs + 1 + max_bs * width,), torch.int32, dev)
        self.seq_lens = self._dev32[:max_bs]
        self.query_start_loc = self._dev32[max_bs : 2 * max_bs + 1]
        self.block_tables = self._dev32[2 * max_bs + 1 :].view(max_bs, width)
        self._host32[:max_bs] = q  # padding entries: a Q-token query without context
        self._host32[max_bs : 2 * max_bs + 1] = torch.arange(0, (max_bs + 1) * q, q)
        self._host32[2 * max_bs + 1 :] = 0
        self._dev64.copy_(self._host64)
        self._dev32.copy_(self._host32)
        self._copied = torch.cuda.Event()
        self.graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.num_replays = 0
        with _gc_paused():
            pool = None
            for bs in reversed(self.batch_sizes):  # largest first: smaller ones share its pool
                pool = self._capture(bs, pool)
        torch.cuda.synchronize()

    def _backend(self, bs: int) -> PagedAttentionBackend:
        backend = PagedAttentionBackend(
            self.kv_caches,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            self.kv_cache_dtype,
        )
        backend.set_metadata(
            AttentionMetadata(
                num_prefills=bs,
                num_prefill_tokens=bs * self.q,
                num_decode_tokens=0,
                slot_mapping=self.slot_mapping[: bs * self.q],
                seq_lens=self.seq_lens[:bs],
                query_start_loc=self.query_start_loc[: bs + 1],
                block_tables=self.block_tables[:bs],
                max_query_len=self.q,
                max_decode_seq_len=0,
            )
        )
        return backend

    @torch.inference_mode()
    def _capture(self, bs: int, pool: Any) -> Any:
        backend = self._backend(bs)
        n = bs * self.q
        ids, pos = self.input_ids[:n], self.positions[:n]
        self.model.forward(ids, pos, backend)  # warm-up: lazy inits must not happen in capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = self.model.forward(ids, pos, backend)
        self.graphs[bs] = (graph, out)
        return graph.pool()

    def release(self) -> None:
        """Destroys every graph now (ModelRunner.release_cuda_graphs says why)."""
        destroy_graphs(self.graphs)

    def can_run(self, plan: Any) -> bool:
        """Some entry feeds several tokens (else the decode graphs run it), none more than Q,
        within the captured sizes. Decided from the layout alone (not from the drafts), so
        every tensor-parallel rank, which gets the plan's arrays, decides the same."""
        n = int(plan.num_seqs)
        if int(plan.max_query_len) <= 1 or int(plan.max_query_len) > self.q:
            return False
        if n > self.batch_sizes[-1]:
            return False
        return int(np.asarray(plan.seq_lens[:n]).max()) + self.q <= self.max_len

    def run(self, plan: Any) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] in the plan's token order."""
        n, q = int(plan.num_seqs), self.q
        bs = next(s for s in self.batch_sizes if s >= n)
        max_bs, width = self.block_tables.shape
        lay = padded_layout(plan, q, bs)
        used = max(1, -(-int(np.asarray(plan.seq_lens[:n]).max()) // self.block_size))
        self._copied.synchronize()  # the previous step's copy has read the mirrors
        h64 = self._host64.numpy()
        h64[0, : bs * q], h64[1, : bs * q], h64[2, : bs * q] = lay.ids, lay.positions, lay.slots
        h32 = self._host32.numpy()
        h32[:bs] = lay.seq_lens
        tables = h32[2 * max_bs + 1 :].reshape(max_bs, width)
        tables[:n, :used] = plan.block_tables[:n, :used]
        self._dev64.copy_(self._host64, non_blocking=True)
        end = 2 * max_bs + 1 + n * width
        self._dev32[:end].copy_(self._host32[:end], non_blocking=True)
        self._copied.record()
        graph, out = self.graphs[bs]
        graph.replay()
        self.num_replays += 1
        index = torch.from_numpy(lay.rows).to(out.device, non_blocking=True)
        return out.index_select(0, index)


@dataclass
class PaddedLayout:
    """A plan's tokens with every entry padded to q query tokens and the batch to bs entries."""

    ids: np.ndarray  # [bs * q] int64 (padding: 0)
    positions: np.ndarray  # [bs * q] int64 (padding: its entry's last position, or 0)
    slots: np.ndarray  # [bs * q] int64 (padding: -1, not written)
    seq_lens: np.ndarray  # [bs] int32: context + q (padding entries: q, no context)
    rows: np.ndarray  # [num_tokens] int64: each plan token's row in the padded layout


def padded_layout(plan: Any, q: int, bs: int) -> PaddedLayout:
    n = int(plan.num_seqs)
    qsl = np.asarray(plan.query_start_loc[: n + 1]).astype(np.int64)
    lens = np.diff(qsl)
    num_tokens = int(qsl[-1])
    entry = np.repeat(np.arange(n), lens)
    rows = entry * q + (np.arange(num_tokens) - qsl[entry])
    positions = np.asarray(plan.positions[:num_tokens])
    ids = np.zeros(bs * q, dtype=np.int64)
    pos = np.zeros(bs * q, dtype=np.int64)
    pos[: n * q] = np.repeat(positions[qsl[1:] - 1], q)
    slots = np.full(bs * q, -1, dtype=np.int64)
    ids[rows] = plan.input_ids[:num_tokens]
    pos[rows] = positions
    slots[rows] = plan.slot_mapping[:num_tokens]
    seq_lens = np.full(bs, q, dtype=np.int32)
    seq_lens[:n] = np.asarray(plan.seq_lens[:n]) + (q - lens)
    return PaddedLayout(ids, pos, slots, seq_lens, rows.astype(np.int64))
