"""A sort-based reference of pagedkv.ops.top_k_top_p_threshold: the same fixed-point masses
(2^-32 units, exact Python integers), the kept sets read off the sorted row."""

from __future__ import annotations

import math

import numpy as np


def threshold_ref(probs: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.float32:
    p = probs.astype(np.float32)
    mass = [int(np.float64(v) * 4294967296.0) if v > 0 else 0 for v in p]
    values = sorted(set(float(v) for v in p), reverse=True)
    n = len(p)
    thr = np.float32(0)
    kth = np.float32(0)
    if 0 < top_k < n:
        kth = np.float32(np.sort(p)[::-1][top_k - 1])
        kth = max(kth, np.float32(0))
        thr = kth
    if top_p < 1.0:
        kept = sum(m for v, m in zip(p, mass) if v >= kth or (kth == 0 and v <= 0))
        target = math.ceil(np.float64(np.float32(top_p)) * float(kept))
        # smallest value whose strictly-greater mass is < target (the largest always qualifies)
        best = None
        for v in values:  # descending
            above = sum(m for x, m in zip(p, mass) if x > v)
            if best is None or above < target:
                best = v
            else:
                break
        thr = max(thr, np.float32(max(best, 0.0)))
    if min_p > 0.0:
        thr = max(thr, np.float32(np.float32(min_p) * p.max()))
    return np.float32(thr)
