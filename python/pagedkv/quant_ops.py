"""The weight-only int4 GEMM (AWQ / GPTQ checkpoints), re-exported by :mod:`pagedkv.ops`.

Weights use one layout whatever the checkpoint's format (models/quantization repacks them on
loading): ``qweight`` [N, K / 2] uint8 with two 4-bit codes per byte (element 2j in the low
nibble), ``scales`` [N, K / G] in the activations' dtype and ``zeros`` [N, K / G] uint8, so
W[n, k] = (q[n, k] - zeros[n, k // G]) * scales[n, k // G]. Errors name the argument
(include/pagedkv/quant.h).
"""

from __future__ import annotations

from typing import Any, Optional

from pagedkv import _C
from pagedkv._tensor import check_array, dtype_name, empty, stream_handle

__all__ = ["int4_gemm"]


def int4_gemm(x: Any, qweight: Any, scales: Any, zeros: Any, group_size: int, *,
              out: Optional[Any] = None, stream: Any = None) -> Any:
    """x [M, K] @ W.T -> [M, N] in x's dtype, W dequantised tile by tile (fp32 accumulation)."""
    for name, a in (("x", x), ("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        check_array(a, name)
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__}")
    if len(x.shape) != 2 or len(qweight.shape) != 2:
        raise ValueError(f"x must be [M, K] and qweight [N, K / 2], got shapes "
                         f"{tuple(x.shape)} and {tuple(qweight.shape)}")
    if out is None:
        out = empty((int(x.shape[0]), int(qweight.shape[0])), dtype_name(x), x)
    _C.quant_int4_gemm(out, x, qweight, scales, zeros, group_size, stream_handle(stream, x))
    return out
