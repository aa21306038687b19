"""Multi-LoRA kernels (punica's BGMV), re-exported by :mod:`pagedkv.ops`.

Every token of a step picks its adapter by an index into stacked adapter weights, so one launch
per op serves all adapters of the step. For a layer ``y = x @ W.T`` with adapters stacked as
``a [L, slices * r, K]`` and ``b [L, N, r]`` (scaling folded into b):

    buf = lora_shrink(x, a, token_lora_indices)                 # [T, slices * r] float32
    lora_expand(y, buf, b, token_lora_indices, slice_sizes)     # y[t] += delta, in place

A token whose index is -1 has no adapter (its row of y is left as it is). Errors name the
argument (see include/pagedkv/lora.h for the exact contract). ``tiled=True`` picks the CUDA
kernels' tiled variant (16-byte packed loads, a tile of tokens per expand CTA sharing each
adapter's B rows; not yet measured on a GPU); the CPU kernels are the same for both.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from pagedkv import _C
from pagedkv._tensor import check_array, empty, stream_handle

__all__ = ["lora_shrink", "lora_expand"]


def _shape2(x: Any, name: str) -> tuple[int, int]:
    if len(x.shape) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")
    return int(x.shape[0]), int(x.shape[1])


def lora_shrink(
    x: Any,
    a: Any,
    token_lora_indices: Any,
    *,
    out: Optional[Any] = None,
    stream: Any = None,
    tiled: bool = False,
) -> Any:
    """``buf[t] = x[t] @ a[token_lora_indices[t]].T`` in float32 (zeros where the index is -1).
    x [T, K], a [L, R, K] (x's dtype) -> buf [T, R] float32."""
    for name, v in (("x", x), ("a", a), ("token_lora_indices", token_lora_indices)):
        check_array(v, name)
    t, _ = _shape2(x, "x")
    if len(a.shape) != 3:
        raise ValueError(f"a must be [num_loras, rank, K], got shape {tuple(a.shape)}")
    if out is None:
        out = empty((t, int(a.shape[1])), "float32", x)
    _C.lora_shrink(out, x, a, token_lora_indices, stream_handle(stream, x), tiled)
    return out


def lora_expand(
    out: Any,
    buf: Any,
    b: Any,
    token_lora_indices: Any,
    slice_sizes: Optional[Sequence[int]] = None,
    *,
    stream: Any = None,
    tiled: bool = False,
) -> Any:
    """``out[t, n] += buf[t, s(n) * r : s(n) * r + r] @ b[token_lora_indices[t], n]`` in place
    (fp32 sum, rounded once), where slice s(n) holds column n (``slice_sizes`` column counts,
    default one slice of all columns). out [T, N], buf [T, slices * r] float32, b [L, N, r]."""
    for name, v in (
        ("out", out),
        ("buf", buf),
        ("b", b),
        ("token_lora_indices", token_lora_indices),
    ):
        check_array(v, name)
    _, n = _shape2(out, "out")
    sizes = [n] if slice_sizes is None else [int(s) for s in slice_sizes]
    _C.lora_expand(out, buf, b, token_lora_indices, sizes, stream_handle(stream, out), tiled)
    return out
