"""Reference attention backends: plain torch, no paging. For tests and HF comparisons; they
honour every AttentionSpec field (scale, sliding window, soft cap) like the paged backend.

DenseAttentionBackend: each forward sees whole sequences (no cache) laid end to end.
ContiguousCacheBackend: a growing per-sequence K/V cache, for step-by-step decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from pagedkv.models.attention_backend import AttentionSpec


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context_len: int,
    spec: AttentionSpec,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """q [Tq, Hq, D] are the tokens at positions context_len.., k/v [Tk, Hkv, D] all keys of the
    sequence (Tk = context_len + Tq); a non-causal spec lets every query see all Tk keys.
    Returns [Tq, Hq, D] in q's dtype. Plain matmul and softmax
    (no fused kernel): the soft cap sits between the two."""
    tq, hq = q.shape[0], q.shape[1]
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    qh = q.to(compute_dtype).transpose(0, 1)  # [Hq, Tq, D]
    kh = k.to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v.to(compute_dtype).transpose(0, 1).repeat_interleave(group, dim=0)
    logits = torch.matmul(qh, kh.transpose(1, 2)) * spec.scale  # [Hq, Tq, Tk]
    if spec.logits_soft_cap > 0:
        logits = spec.logits_soft_cap * torch.tanh(logits / spec.logits_soft_cap)
    rows = torch.arange(tq, device=q.device)[:, None] + context_len
    cols = torch.arange(tk, device=q.device)[None, :]
    visible = (cols <= rows) | (not spec.causal)  # [Tq, Tk]
    if spec.sliding_window is not None:
        visible &= cols > rows - spec.sliding_window
    logits = logits.masked_fill(~visible, float("-inf"))
    out = torch.matmul(torch.softmax(logits, dim=-1), vh)
    return out.transpose(0, 1).to(q.dtype)


class DenseAttentionBackend:
    """Causal attention within each sequence of the current batch only (prefill from scratch).

    Set ``query_start_loc`` ([num_seqs + 1] prefix sums of sequence lengths) before a forward;
    None means the whole batch is one sequence.
    """

    def __init__(
        self,
        query_start_loc: Optional[Sequence[int]] = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.query_start_loc = (
            None if query_start_loc is None else [int(x) for x in query_start_loc]
        )
        self.compute_dtype = compute_dtype

    def forward(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        loc = self.query_start_loc or [0, q.shape[0]]
        if loc[-1] != q.shape[0]:
            raise ValueError(
                f"query_start_loc ends at {loc[-1]} but the batch has {q.shape[0]} tokens"
            )
        outs = [
            causal_attention(q[a:b], k[a:b], v[a:b], 0, spec, self.compute_dtype)
            for a, b in zip(loc[:-1], loc[1:])
        ]
        return torch.cat(outs, dim=0)


class ContiguousCacheBackend:
    """Keeps every sequence's K/V per layer in growing tensors (no blocks, no eviction).

    Before each forward call ``begin_step(seq_ids, query_lens)``: the batch's tokens are the
    sequences' new tokens laid end to end in that order, appended after what each already has.
    """

    def __init__(self, num_layers: int, compute_dtype: torch.dtype = torch.float32) -> None:
        self.num_layers = num_layers
        self.compute_dtype = compute_dtype
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

    def forward(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
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
            outs.append(causal_attention(q[a:b], kk, vv, ctx, spec, self.compute_dtype))
        return torch.cat(outs, dim=0)
