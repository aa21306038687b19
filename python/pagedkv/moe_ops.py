"""Mixture-of-experts kernels (vLLM's ``fused_moe`` building blocks), re-exported by
:mod:`pagedkv.ops`.

Arrays may come from numpy, torch (CPU or CUDA), cupy or any ``__dlpack__`` object; outputs are
allocated in the caller's framework on the caller's device. The pipeline of one MoE layer:

    weights, ids = topk_softmax(router_logits, top_k, renormalize)
    sorted_ids, expert_ids, used = moe_align_block_size(ids, block_size, num_experts)
    h = moe_grouped_gemm(x, w13, sorted_ids, expert_ids, used, top_k, block_size)      # [T*k, 2I]
    y = moe_grouped_gemm(act(h), w2, sorted_ids, expert_ids, used, 1, block_size,
                         topk_weights=weights)                                           # [T*k, H]
    out = y.view(T, k, H).sum(1)

Errors name the argument (see include/pagedkv/moe.h for the exact contract).
"""

from __future__ import annotations

from typing import Any, Optional

from pagedkv import _C
from pagedkv._tensor import check_array, dtype_name, empty, stream_handle

__all__ = ["topk_softmax", "moe_align_block_size", "moe_grouped_gemm", "moe_max_padded_tokens",
           "moe_block_size"]


def _positive_int(x: Any, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) and not hasattr(x, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    value = int(x)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def moe_block_size(num_pairs: int, num_experts: int) -> int:
    """The block size (rows of one expert per grouped-GEMM tile) for ``num_pairs`` = tokens *
    top_k: 16 while the average expert gets few rows (decode), up to 64 for large batches,
    where a taller tile reuses each loaded expert weight over more rows."""
    per_expert = num_pairs / max(1, num_experts)
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def moe_max_padded_tokens(num_pairs: int, num_experts: int, block_size: int) -> int:
    """Length of ``sorted_token_ids`` that moe_align_block_size needs (worst case)."""
    return int(_C.moe_max_padded_tokens(int(num_pairs), int(num_experts), int(block_size)))


def topk_softmax(gating_output: Any, top_k: int, renormalize: bool, *,
                 stream: Any = None) -> tuple[Any, Any]:
    """Router logits [T, E] -> (top-k weights [T, k] float32, expert ids [T, k] int32): softmax
    over all experts, the k largest (largest first), divided by their sum with ``renormalize``
    (Mixtral, Qwen3-MoE's ``norm_topk_prob``)."""
    check_array(gating_output, "gating_output")
    k = _positive_int(top_k, "top_k")
    if len(gating_output.shape) != 2:
        raise ValueError(f"gating_output must be [num_tokens, num_experts], got shape "
                         f"{tuple(gating_output.shape)}")
    t = int(gating_output.shape[0])
    weights = empty((t, k), "float32", gating_output)
    ids = empty((t, k), "int32", gating_output)
    _C.moe_topk_softmax(weights, ids, gating_output, bool(renormalize),
                        stream_handle(stream, gating_output))
    return weights, ids


def moe_align_block_size(topk_ids: Any, block_size: int, num_experts: int, *,
                         stream: Any = None) -> tuple[Any, Any, Any]:
    """topk_ids [T, k] int32 -> (sorted_token_ids, expert_ids, num_tokens_post_pad [1]): the
    pairs t*k + j grouped by expert, each group padded with T*k to a multiple of block_size,
    and the expert of each block (-1 past the used length)."""
    check_array(topk_ids, "topk_ids")
    bs, e = _positive_int(block_size, "block_size"), _positive_int(num_experts, "num_experts")
    pairs = 1
    for s in topk_ids.shape:
        pairs *= int(s)
    length = moe_max_padded_tokens(pairs, e, bs)
    sorted_ids = empty((length,), "int32", topk_ids)
    expert_ids = empty((length // bs,), "int32", topk_ids)
    used = empty((1,), "int32", topk_ids)
    _C.moe_align_block_size(topk_ids, e, bs, sorted_ids, expert_ids, used,
                            stream_handle(stream, topk_ids))
    return sorted_ids, expert_ids, used


def moe_grouped_gemm(a: Any, w: Any, sorted_token_ids: Any, expert_ids: Any,
                     num_tokens_post_pad: Any, top_k: int, block_size: int,
                     topk_weights: Optional[Any] = None, *, out: Optional[Any] = None,
                     stream: Any = None) -> Any:
    """One grouped GEMM over all experts: for each pair i (in the blocks of
    moe_align_block_size), ``out[i] = a[i // top_k] @ w[expert of i].T`` (times
    ``topk_weights[i]`` when given). a [M, K], w [E, N, K] -> out [M * top_k, N] in a's dtype."""
    for name, x in (("a", a), ("w", w)):
        check_array(x, name)
    k = _positive_int(top_k, "top_k")
    if len(a.shape) != 2 or len(w.shape) != 3:
        raise ValueError(f"a must be [M, K] and w [E, N, K], got shapes {tuple(a.shape)} and "
                         f"{tuple(w.shape)}")
    if out is None:
        out = empty((int(a.shape[0]) * k, int(w.shape[1])), dtype_name(a), a)
    _C.moe_grouped_gemm(out, a, w, sorted_token_ids, expert_ids, num_tokens_post_pad, k,
                        _positive_int(block_size, "block_size"), topk_weights,
                        stream_handle(stream, a))
    return out
