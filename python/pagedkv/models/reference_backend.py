"""Reference attention backends: plain torch, no paging. For tests and HF comparisons.

DenseAttentionBackend: each forward sees whole sequences (no cache) laid end to end.
ContiguousCacheBackend: a growing per-sequence K/V cache, for step-by-step decoding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch
import torch.nn.functional as F


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int,
                     scale: Optional[float] = None,
                     compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [Tq, Hq, D] are the tokens at positions context_len.., k/v [Tk, Hkv, D] all keys of the
    sequence (Tk = context_len + Tq). Returns [Tq, Hq, D] in q's dtype."""
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    group = hq // hkv
    qh = q.to(compute_dtype).transpose(0, 1)  # [Hq, Tq, D]
    kh = k.to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
    rows = torch.arange(tq, device=q.device)[:, None] + context_len
    mask = torch.arange(tk, device=q.device)[None, :] <= rows  # [Tq, Tk] True = attend
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(0, 1).to(q.dtype)


class DenseAttentionBackend:
    """Causal attention within each sequence of the current batch only (prefill from scratch).

    Set ``query_start_loc`` ([num_seqs + 1] prefix sums of sequence lengths) before a forward;
    None means the whole batch is one sequence.
    """

    def __init__(self, query_start_loc: Optional[Sequence[int]] = None,
                 compute_dtype: torch.dtype = torch.float32,
                 scale: Optional[float] = None) -> None:
        self.query_start_loc = None if query_start_loc is None else [int(x) for x in
                                                                      query_start_loc]
        self.compute_dtype = compute_dtype
        self.scale = scale

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> torch.Tensor:
        loc = self.query_start_loc or [0, q.shape[0]]
        if loc[-1] != q.shape[0]:
            raise ValueError(f"query_start_loc ends at {loc[-1]} but the batch has "
                             f"{q.shape[0]} tokens")
        outs = [causal_attention(q[a:b], k[a:b], v[a:b], 0, self.scale, self.compute_dtype)
                for a, b in zip(loc[:-1], loc[1:])]
        return torch.cat(outs, dim=0)


class ContiguousCacheBackend:
    """Keeps every sequence's K/V per layer in growing tensors (no blocks, no eviction).

    Before each forward call ``begin_step(seq_ids, query_lens)``: the batch's tokens are the
    sequences' new tokens laid end to end in that order, appended after what each already has.
    """

    def __init__(self, num_layers: int, compute_dtype: torch.dtype = torch.float32,
                 scale: Optional[float] = None) -> None:
        self.num_layers = num_layers
        self.compute_dtype = compute_dtype
        self.scale = scale
        self.cache: dict[int, list[Optional[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self._seq_ids: list[int] = []
        self._loc: list[int] = [0]

    def begin_step(self, seq_ids: Sequence[int], query_lens: Sequence[int]) -> None:
        if len(seq_ids) != len(query_lens):
            raise ValueError("seq_ids and query_lens must have the same length")
        self._seq_ids = list(seq_ids)
        self._loc = [0]
        for n in query_lens:
            self._loc.append(self._loc[-1] + int(n))
        for s in self._seq_ids:
            self.cache.setdefault(s, [None] * self.num_layers)

    def context_len(self, seq_id: int) -> int:
        """Tokens cached for seq_id (layer 0's count)."""
        entry = self.cache.get(seq_id)
        return 0 if not entry or entry[0] is None else int(entry[0][0].shape[0])

    def free(self, seq_id: int) -> None:
        self.cache.pop(seq_id, None)

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                ) -> torch.Tensor:
        if self._loc[-1] != q.shape[0]:
            raise ValueError(f"begin_step announced {self._loc[-1]} tokens, got {q.shape[0]}")
        outs = []
        for i, s in enumerate(self._seq_ids):
            a, b = self._loc[i], self._loc[i + 1]
            old = self.cache[s][layer_idx]
            ctx = 0 if old is None else old[0].shape[0]
            kk = k[a:b] if old is None else torch.cat([old[0], k[a:b]])
            vv = v[a:b] if old is None else torch.cat([old[1], v[a:b]])
            self.cache[s][layer_idx] = (kk, vv)
            outs.append(causal_attention(q[a:b], kk, vv, ctx, self.scale, self.compute_dtype))
        return torch.cat(outs, dim=0)
