"""float64 references of the multi-LoRA ops and random cases for them (CPU and CUDA tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

# Tolerance (atol = rtol) of an op's output against the float64 reference, by input dtype.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def shrink_ref(x: np.ndarray, a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """buf[t] = x[t] @ a[idx[t]].T, zeros where idx[t] == -1."""
    out = np.zeros((x.shape[0], a.shape[1]))
    for t, lora in enumerate(idx):
        if lora >= 0:
            out[t] = x[t] @ a[lora].T
    return out


def expand_ref(
    out: np.ndarray, buf: np.ndarray, b: np.ndarray, idx: np.ndarray, slice_sizes: list[int]
) -> np.ndarray:
    """out[t, n] + buf[t, slice(n)] @ b[idx[t], n] for tokens with an adapter."""
    res = out.copy()
    r = b.shape[2]
    slice_of = np.repeat(np.arange(len(slice_sizes)), slice_sizes)
    for t, lora in enumerate(idx):
        if lora < 0:
            continue
        for n in range(out.shape[1]):
            s = slice_of[n]
            res[t, n] += buf[t, s * r : (s + 1) * r] @ b[lora, n]
    return res


def random_indices(torch: Any, tokens: int, num_loras: int, gen: Any) -> Any:
    """int32 indices in [-1, num_loras): some tokens without an adapter."""
    return torch.randint(-1, num_loras, (tokens,), generator=gen, dtype=torch.int32)


def lora_linear_ref(
    weight: np.ndarray,
    bias: Any,
    x: np.ndarray,
    adapters: list[dict[int, tuple[np.ndarray, np.ndarray]]],
    idx: np.ndarray,
    slice_sizes: list[int],
) -> np.ndarray:
    """A LoRA layer's output in float64 from the adapters' own matrices: ``x W^T + bias`` plus,
    for each token with a slot, ``x A_i^T B_i^T`` in the columns of each slice i its adapter
    targets (``adapters[slot][i] = (A [r, in], B [slice_i, r])``)."""
    y = x @ weight.T + (0.0 if bias is None else bias)
    starts = np.concatenate([[0], np.cumsum(slice_sizes)])
    for t, slot in enumerate(idx):
        if slot < 0:
            continue
        for i, (a, b) in adapters[slot].items():
            y[t, starts[i] : starts[i + 1]] += x[t] @ a.T @ b.T
    return y
