"""Framework bridge: arrays from numpy, torch, cupy or jax go to the C++ ops through DLPack;
outputs are allocated in the caller's framework, on the caller's device.

The C++ side sees every array as a DLPack tensor (nanobind imports anything with
``__dlpack__``), so this module only has to (1) allocate outputs like a given input, (2) find the
CUDA stream the caller is working on and (3) give clear errors for objects that are not arrays.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

__all__ = ["framework", "is_cuda", "empty", "zeros", "current_stream", "check_array", "dlpack_arg"]

_DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8", "int8", "int32", "int64", "bool")


def framework(x: Any) -> str:
    """Name of the array library that owns ``x``: numpy, torch, cupy or jax."""
    mod = type(x).__module__.split(".")[0]
    if mod in ("numpy", "torch", "cupy"):
        return mod
    if mod in ("jax", "jaxlib"):
        return "jax"
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    raise TypeError(
        f"expected an array (numpy, torch, cupy, jax or any __dlpack__ object), "
        f"got {type(x).__name__}"
    )


def check_array(x: Any, name: str) -> Any:
    """Returns ``x`` if it is an array; raises a TypeError naming the argument otherwise."""
    if not (hasattr(x, "__dlpack__") or hasattr(x, "__array_interface__")):
        raise TypeError(
            f"{name} must be an array (numpy, torch, cupy, jax), got {type(x).__name__}"
        )
    return x


def dlpack_arg(x: Any) -> Any:
    """``x`` as handed to a ``_C`` op: a torch tensor as a DLPack capsule
    (``torch.utils.dlpack.to_dlpack``, ~1 us), anything else as is. nanobind imports a tensor
    through ``x.__dlpack__()`` otherwise, ~6 us a tensor (and for CUDA tensors a stream
    handshake the ops do not need: they run on the stream they are given), which made the host
    side of a small fused op several times its GPU time."""
    if type(x).__module__.startswith("torch"):
        torch = sys.modules["torch"]
        if isinstance(x, torch.Tensor):
            return torch.utils.dlpack.to_dlpack(x)
    return x


def is_cuda(x: Any) -> bool:
    """True when ``x`` lives in GPU memory."""
    if type(x).__module__.startswith("torch") and isinstance(getattr(x, "is_cuda", None), bool):
        return x.is_cuda  # torch's own flag: its __dlpack_device__() costs ~9 us a call
    dev = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
    return int(dev) == 2  # kDLCUDA


def dtype_name(x: Any) -> str:
    """The element type of ``x`` as a plain name ("float16", "bfloat16", ...)."""
    name = str(x.dtype).rsplit(".", 1)[-1]
    return name


def _torch_dtype(torch: Any, dtype: str) -> Any:
    return getattr(torch, dtype) if dtype != "bool" else torch.bool


def empty(shape: Sequence[int], dtype: str, like: Any) -> Any:
    """An uninitialised array of ``shape``/``dtype`` in ``like``'s framework and device."""
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    fw = framework(like)
    shape = tuple(int(s) for s in shape)
    if fw == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=_torch_dtype(torch, dtype), device=like.device)
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        with like.device:
            return cupy.empty(shape, dtype=_np_dtype(dtype))
    if fw == "jax":
        # jax arrays are immutable: ops write into a numpy / cupy buffer that is then converted
        # (zero-copy through DLPack) by `finish`.
        return _numpy_empty(shape, dtype)
    return _numpy_empty(shape, dtype)


def zeros(shape: Sequence[int], dtype: str, like: Any) -> Any:
    out = empty(shape, dtype, like)
    out[...] = 0
    return out


def finish(out: Any, like: Any) -> Any:
    """Converts an output allocated by :func:`empty` to ``like``'s framework where needed."""
    if framework(like) == "jax":
        import jax.numpy as jnp

        return jnp.asarray(out)
    return out


def _np_dtype(dtype: str) -> Any:
    import numpy as np

    if dtype == "bfloat16":
        try:
            import ml_dtypes

            return ml_dtypes.bfloat16
        except ImportError as e:  # numpy has no bfloat16 of its own
            raise TypeError("bfloat16 numpy arrays need the ml_dtypes package") from e
    return np.dtype(dtype)


def _numpy_empty(shape: tuple, dtype: str) -> Any:
    import numpy as np

    return np.empty(shape, dtype=_np_dtype(dtype))


def stream_handle(stream: Any, x: Any) -> int:
    """The CUDA stream handle to launch on for array ``x``: ``stream`` given as an int handle, a
    ``torch.cuda.Stream`` or a cupy stream, or the caller's current stream (None). The kernels
    check that the stream belongs to ``x``'s GPU."""
    if stream is None:
        return current_stream(x)
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return handle
    if isinstance(stream, int) and not isinstance(stream, bool):
        # A handle is a pointer (cudaStream_t): the binding takes it as an unsigned 64-bit int.
        if not 0 <= stream < 2**64:
            raise ValueError(
                f"stream: a CUDA stream handle is a pointer value in [0, 2**64), got {stream}"
            )
        return stream
    raise TypeError(
        "stream: expected a CUDA stream handle (int), a torch.cuda.Stream or a cupy "
        f"stream, got {type(stream).__name__}"
    )


def current_stream(x: Any) -> int:
    """The CUDA stream handle the caller is working on for array ``x`` (0 for CPU arrays).

    torch: ``torch.cuda.current_stream(x.device)``; cupy: the current stream; anything else on
    the GPU: the legacy default stream (0), unless the caller passes ``stream=`` explicitly.
    """
    if not is_cuda(x):
        return 0
    fw = framework(x)
    if fw == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(x.device).cuda_stream)
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        return int(cupy.cuda.get_current_stream().ptr)
    return 0
