"""A step's M-RoPE positions (Qwen2-VL, models/mrotary.py): each of the step's rows takes its
three position ids from its request's positions computed at admission
(MultiModalInputs.mrope_positions, by prompt index), and a row past the prompt (a decode, or a
generated token recomputed after preemption) is at its index + the request's delta on all
three. Requests without images have three equal positions, their plain index.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np


def step_mrope_positions(plan: Any, entries: Sequence[Any]) -> Optional[np.ndarray]:
    """[3, num_tokens] int64 positions of the plan's rows, or None when no row's request has
    images (then the plan's own positions are everyone's, and plain rope is M-RoPE)."""
    n_tok = int(plan.num_tokens)
    qsl = plan.query_start_loc
    positions = np.asarray(plan.positions[:n_tok], dtype=np.int64)
    out: Optional[np.ndarray] = None
    for i, entry in enumerate(entries):
        mm = getattr(entry[0], "mm", None) if entry is not None else None
        if mm is None or mm.mrope_positions is None:
            continue
        if out is None:
            out = np.broadcast_to(positions, (3, n_tok)).copy()
        start, end = int(qsl[i]), int(qsl[i + 1])
        index = positions[start:end]
        prompt = mm.mrope_positions
        inside = index < prompt.shape[1]
        rows = np.arange(start, end)
        out[:, rows[inside]] = prompt[:, index[inside]]
        out[:, rows[~inside]] = index[~inside] + mm.mrope_delta
    return out
