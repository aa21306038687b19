"""Sampling ops: the truncation thresholds of top-k / top-p / min-p sampling for a batch, found
by a radix search over the probabilities instead of a vocabulary sort (include/pagedkv/
sampling_ops.h). Re-exported by :mod:`pagedkv.ops`."""

from __future__ import annotations

from typing import Any

from pagedkv import _C
from pagedkv._tensor import check_array, stream_handle

__all__ = ["top_k_top_p_threshold"]


def top_k_top_p_threshold(thresholds: Any, probs: Any, top_k: Any, top_p: Any, min_p: Any, *,
                          stream: Any = None) -> None:
    """Writes thresholds[b] (float32 [B]) so that top-k / top-p / min-p sampling of probs[b]
    (float32 [B, V], values in [0, 1]) keeps exactly the tokens with probs >= thresholds[b].
    top_k: int32 [B] (<= 0: off); top_p: float32 [B] (1: off; applied after top-k); min_p:
    float32 [B] (0: off). Exact (fixed-point masses), identical on CPU and CUDA."""
    for name, a in (("thresholds", thresholds), ("probs", probs), ("top_k", top_k),
                    ("top_p", top_p), ("min_p", min_p)):
        check_array(a, name)
    _C.ops_top_k_top_p_threshold(thresholds, probs, top_k, top_p, min_p,
                                 stream_handle(stream, probs))
