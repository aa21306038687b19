"""Fused layer ops (``vllm._custom_ops`` names and argument order): RMSNorm, residual add +
RMSNorm, rotary embedding, gated activations. Re-exported by :mod:`pagedkv.ops`.

Arrays: numpy, torch (CPU or CUDA), cupy or any ``__dlpack__`` object of float32 / float16 /
bfloat16, rank 1 to 3 with a contiguous last dimension (leading dimensions may be strided
views, e.g. q / k slices of a fused qkv projection). Outputs and the in-place arguments are
written without copies, on the arrays' device (CUDA: on ``stream``, default the caller's current
stream; no synchronisation, CUDA-graph safe). Rounding follows the eager HF formulas in the
array's dtype (include/pagedkv/layer_ops.h), so the ops reproduce the reference models' values.
"""

from __future__ import annotations

from typing import Any, Optional

from pagedkv import _C
from pagedkv._tensor import check_array, dlpack_arg, framework, stream_handle

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
]


def _float(x: Any, name: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(x).__name__}")
    return float(x)


def rms_norm(
    out: Any,
    input: Any,
    weight: Any,
    epsilon: float,
    *,
    weight_offset: float = 0.0,
    stream: Any = None,
) -> None:
    """out = input / sqrt(mean(input^2) + epsilon) * (weight_offset + weight) over the last
    dimension. ``out`` may be ``input`` itself (in place); weight_offset=1.0 is Gemma's
    ``1 + w``."""
    for name, a in (("out", out), ("input", input), ("weight", weight)):
        check_array(a, name)
    _C.ops_rms_norm(
        dlpack_arg(out),
        dlpack_arg(input),
        dlpack_arg(weight),
        _float(epsilon, "epsilon"),
        _float(weight_offset, "weight_offset"),
        stream_handle(stream, input),
    )


def fused_add_rms_norm(
    input: Any,
    residual: Any,
    weight: Any,
    epsilon: float,
    *,
    weight_offset: float = 0.0,
    stream: Any = None,
) -> None:
    """In place: ``residual = input + residual``, then ``input = rms_norm(residual)``."""
    for name, a in (("input", input), ("residual", residual), ("weight", weight)):
        check_array(a, name)
    _C.ops_fused_add_rms_norm(
        dlpack_arg(input),
        dlpack_arg(residual),
        dlpack_arg(weight),
        _float(epsilon, "epsilon"),
        _float(weight_offset, "weight_offset"),
        stream_handle(stream, input),
    )


def _heads(x: Any, head_size: int, name: str) -> Any:
    """``x`` as [tokens, heads, head_size]: a rank-3 array as is, a [tokens, heads * head_size]
    one as a view (never a copy: the op writes it in place)."""
    shape = tuple(x.shape)
    if len(shape) != 2:
        return x
    if head_size <= 0 or shape[1] % head_size:
        raise ValueError(
            f"{name} has shape {shape}: its last dimension must be a multiple of "
            f"head_size = {head_size}"
        )
    fw = framework(x)
    if fw == "torch":
        return x.view(shape[0], shape[1] // head_size, head_size)
    if fw == "numpy":
        view = x.view()
        view.shape = (shape[0], shape[1] // head_size, head_size)  # raises rather than copy
        return view
    raise ValueError(
        f"{name}: pass a [tokens, heads, head_size] array ({fw} arrays of rank 2 "
        f"cannot be viewed without a copy here)"
    )


def rotary_embedding(
    positions: Any,
    query: Any,
    key: Optional[Any],
    head_size: int,
    cos_sin_cache: Any,
    is_neox: bool = True,
    *,
    stream: Any = None,
) -> None:
    """Rotates ``query`` and ``key`` ([tokens, heads, head_size] or [tokens, heads * head_size])
    in place by ``cos_sin_cache[positions]`` ([max_position, rotary_dim]: cos | sin halves).
    The first rotary_dim dims of each head rotate; is_neox pairs (i, i + rotary_dim / 2), else
    (2i, 2i + 1) (GPT-J). positions: int64 / int32 [tokens]."""
    if isinstance(head_size, bool) or not isinstance(head_size, int):
        raise TypeError(f"head_size must be an int, got {type(head_size).__name__}")
    for name, a in (("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)):
        check_array(a, name)
    q = _heads(query, head_size, "query")
    k = None if key is None else _heads(check_array(key, "key"), head_size, "key")
    if len(q.shape) == 3 and int(q.shape[2]) != head_size:
        raise ValueError(f"query has head size {q.shape[2]} but head_size = {head_size}")
    _C.ops_rotary_embedding(
        dlpack_arg(positions),
        dlpack_arg(q),
        None if k is None else dlpack_arg(k),
        dlpack_arg(cos_sin_cache),
        bool(is_neox),
        stream_handle(stream, query),
    )


def _act_and_mul(activation: str, out: Any, input: Any, stream: Any) -> None:
    check_array(out, "out")
    check_array(input, "input")
    _C.ops_act_and_mul(activation, dlpack_arg(out), dlpack_arg(input), stream_handle(stream, input))


def silu_and_mul(out: Any, input: Any, *, stream: Any = None) -> None:
    """out[..., d] = silu(input[..., :d]) * input[..., d:]."""
    _act_and_mul("silu", out, input, stream)


def gelu_and_mul(out: Any, input: Any, *, stream: Any = None) -> None:
    """out[..., d] = gelu(input[..., :d]) * input[..., d:] (exact, erf GELU)."""
    _act_and_mul("gelu", out, input, stream)


def gelu_tanh_and_mul(out: Any, input: Any, *, stream: Any = None) -> None:
    """out[..., d] = gelu_tanh(input[..., :d]) * input[..., d:] (the tanh approximation)."""
    _act_and_mul("gelu_tanh", out, input, stream)
