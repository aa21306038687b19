"""Sampling ops: the truncation thresholds of top-k / top-p / min-p sampling for a batch, found
by a radix search over the probabilities instead of a vocabulary sort (include/pagedkv/
sampling_ops.h), and the batch's draw from the truncated distributions. Re-exported by
:mod:`pagedkv.ops`."""

from __future__ import annotations

from typing import Any

from pagedkv import _C
from pagedkv._tensor import check_array, dlpack_arg, stream_handle

__all__ = ["top_k_top_p_threshold", "sample_exponential_race"]


def top_k_top_p_threshold(
    thresholds: Any, probs: Any, top_k: Any, top_p: Any, min_p: Any, *, stream: Any = None
) -> None:
    """Writes thresholds[b] (float32 [B]) so that top-k / top-p / min-p sampling of probs[b]
    (float32 [B, V], values in [0, 1]) keeps exactly the tokens with probs >= thresholds[b].
    top_k: int32 [B] (<= 0: off); top_p: float32 [B] (1: off; applied after top-k); min_p:
    float32 [B] (0: off). Exact (fixed-point masses), identical on CPU and CUDA."""
    for name, a in (
        ("thresholds", thresholds),
        ("probs", probs),
        ("top_k", top_k),
        ("top_p", top_p),
        ("min_p", min_p),
    ):
        check_array(a, name)
    t, p, k, tp, mp = map(dlpack_arg, (thresholds, probs, top_k, top_p, min_p))
    _C.ops_top_k_top_p_threshold(t, p, k, tp, mp, stream_handle(stream, probs))


def sample_exponential_race(
    tokens: Any, probs: Any, thresholds: Any, keys: Any, *, stream: Any = None
) -> None:
    """tokens[b] (int64 [B]) = a draw from probs[b] (float32 [B, V], unnormalised) restricted to
    probs >= thresholds[b] (float32 [B]), by the exponential race with counter-based noise keyed
    by keys[b] (int64 [B]): a row's token depends on its own probabilities and key only."""
    for name, a in (
        ("tokens", tokens),
        ("probs", probs),
        ("thresholds", thresholds),
        ("keys", keys),
    ):
        check_array(a, name)
    o, p, t, k = map(dlpack_arg, (tokens, probs, thresholds, keys))
    _C.ops_sample_exponential_race(o, p, t, k, stream_handle(stream, probs))
