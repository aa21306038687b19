"""vLLM-named paged KV-cache kernels (``vllm._custom_ops`` argument order).

Every array argument may be a numpy array, a torch tensor (CPU or CUDA), a cupy array or any
``__dlpack__`` object; caches and outputs are written in place (never copied). The work runs on
the device of the arrays: the C++ CPU kernels for host arrays, the CUDA kernels for GPU arrays
(on ``stream``: an int handle, a ``torch.cuda.Stream`` or a cupy stream of the arrays' GPU; by
default the caller's current torch / cupy stream).

``k_scale`` / ``v_scale`` (fp8 caches) may be numbers or 1-element arrays. A float32 array is
handed to the kernels, which read it on its device: a CUDA tensor scale (what vLLM passes) costs
no host synchronisation, and a captured CUDA graph reads its value at each replay. Host arrays of
other float dtypes are read on the host; CUDA arrays must be float32.

Arrays an op only reads may be read-only (numpy ``setflags(write=False)``, ``np.broadcast_to``,
a read-only memmap); what it writes (``out``, the caches of the cache writes, ``dst``, ...) must
be writable, else a ValueError names it. What an op writes must not share memory with what it
reads (no in-place use, no views of one buffer) nor repeat its own elements (a torch ``expand``
view): ValueError naming both. On CUDA the 1-D metadata (seq_lens, query_start_loc,
slot_mapping, alibi_slopes) and block-table rows must be contiguous. Integer arguments take
ints, integer scalars or integral floats that fit in int32. Empty batches (0 sequences /
tokens / mapping rows) are no-ops. Errors name the argument.

The attention ops take ``kernel`` (one of ``ATTENTION_KERNELS``): ``"auto"`` runs the first
kernel that covers the call; a named one (``"hopper"``, ``"tensor_core"``, ``"cuda_core"`` on a
GPU, ``"cpu"`` on the host) is required, and a call it does not cover raises ValueError saying
why (docs/kernels.md). The vocabularies the ops share (``KV_CACHE_DTYPES``,
``SUPPORTED_HEAD_SIZES``, ``PARTITION_SIZE``, ``ATTENTION_KERNELS``) are defined once in
include/pagedkv/ops.h and read from there.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any, Optional, Sequence

from pagedkv import _C
from pagedkv._tensor import check_array, is_cuda, stream_handle

# The fused layer ops (norms, rotary, gated activations) and the sampling thresholds live in
# their own modules; they are re-exported here, beside the attention ops.
from pagedkv.layer_ops import (
    fused_add_rms_norm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
)
from pagedkv.sampling_ops import sample_exponential_race, top_k_top_p_threshold

__all__ = [
    "reshape_and_cache",
    "reshape_and_cache_flash",
    "paged_attention_v1",
    "paged_attention_v2",
    "paged_attention_balanced",
    "plan_balanced_decode",
    "balanced_decode_target",
    "balanced_plan_capacity",
    "merge_attn_states",
    "BALANCED_MIN_CHUNK",
    "BALANCED_ITEM_INTS",
    "decode_kernel",
    "decode_partition_size",
    "context_attention_fwd",
    "copy_blocks",
    "swap_blocks",
    "PARTITION_SIZE",
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "KV_CACHE_DTYPES",
    "SUPPORTED_HEAD_SIZES",
    "ATTENTION_KERNELS",
    "top_k_top_p_threshold",
    "sample_exponential_race",
]

#: Keys per partition of paged_attention_v2 (vLLM's _PARTITION_SIZE).
PARTITION_SIZE: int = _C.PARTITION_SIZE
#: Default shortest piece (keys) of a work-balanced decode plan.
BALANCED_MIN_CHUNK: int = _C.BALANCED_MIN_CHUNK
#: Ints per work item of a balanced plan: (seq, key_lo, key_hi, row).
BALANCED_ITEM_INTS: int = _C.BALANCED_ITEM_INTS
#: kv_cache_dtype names ("fp8" = "fp8_e4m3"), in vLLM's order.
KV_CACHE_DTYPES: tuple[str, ...] = _C.KV_CACHE_DTYPES
#: Head sizes every attention op supports.
SUPPORTED_HEAD_SIZES: tuple[int, ...] = _C.SUPPORTED_HEAD_SIZES
#: Values of the attention ops' ``kernel`` argument ("auto" first).
ATTENTION_KERNELS: tuple[str, ...] = _C.ATTENTION_KERNELS


def _scalar(x: Any, name: str) -> float:
    """A Python float from a number or a 1-element array (host read; syncs for CUDA arrays)."""
    if isinstance(x, (int, float)):
        return float(x)
    if hasattr(x, "item") and hasattr(x, "shape"):
        size = 1
        for s in x.shape:
            size *= int(s)
        if size != 1:
            raise ValueError(
                f"{name} must be a float or a 1-element array, got shape {tuple(x.shape)}"
            )
        return float(x.reshape(()).item() if hasattr(x, "reshape") else x.item())
    raise TypeError(f"{name} must be a float or a 1-element array, got {type(x).__name__}")


def _scale(x: Any, name: str) -> tuple[float, Any]:
    """An fp8 scale as the ops take it: (number, None), or (1.0, a 1-element float32 array) that
    the kernels read on the array's device (no host synchronisation)."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool):  # numpy scalars too
        return float(x), None
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(f"{name} must be a number or a 1-element array, got {type(x).__name__}")
    size = 1
    for s in x.shape:
        size *= int(s)
    if size != 1:
        raise ValueError(
            f"{name} must be a number or a 1-element array, got shape "
            f"{tuple(int(s) for s in x.shape)}"
        )
    if str(x.dtype).rsplit(".", 1)[-1] == "float32":
        check_array(x, name)
        return 1.0, x
    if is_cuda(x):
        raise TypeError(
            f"{name} on the GPU must be float32 (the kernels read it there), got {x.dtype}"
        )
    return float(x.reshape(()).item() if hasattr(x, "reshape") else x.item()), None


def _scale_args(k_scale: Any, v_scale: Any) -> tuple[float, float, dict]:
    """k_scale / v_scale for the bindings: the two numbers, and the arrays as keywords."""
    k, k_array = _scale(k_scale, "k_scale")
    v, v_array = _scale(v_scale, "v_scale")
    return k, v, {"k_scale_array": k_array, "v_scale_array": v_array}


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _int(x: Any, name: str) -> int:
    """``x`` as an int for a C++ ``int`` parameter: an int, a numpy / torch integer scalar or an
    integral float. A TypeError naming the argument for anything else (a float like 2.7 is not
    truncated), a ValueError when it does not fit in int32 (instead of nanobind's dump of the
    whole signature)."""
    try:
        value = operator.index(x)
    except TypeError:
        if (
            not isinstance(x, numbers.Real)
            or not math.isfinite(float(x))
            or not float(x).is_integer()
        ):
            shown = repr(x) if isinstance(x, numbers.Real) else type(x).__name__
            raise TypeError(f"{name} must be an integer, got {shown}") from None
        value = int(float(x))
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise ValueError(
            f"{name} = {value} is out of range: it must fit in a 32-bit int "
            f"[{_INT32_MIN}, {_INT32_MAX}]"
        )
    return value


def _str(x: Any, name: str) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{name} must be a str, got {type(x).__name__}")
    return x


def _bool(x: Any, name: str) -> bool:
    """A Python bool (an int or a string is refused: a flag passed positionally by mistake)."""
    if isinstance(x, bool):
        return x
    raise TypeError(f"{name} must be a bool, got {type(x).__name__}")


def _window(sliding_window: Optional[int]) -> int:
    if sliding_window is None:
        return -1
    window = _int(sliding_window, "sliding_window")
    return -1 if window <= 0 else window


def _arrays(**arrays: Any) -> None:
    """Each argument is an array (None allowed for alibi_slopes) of a dtype the ops can read."""
    for name, a in arrays.items():
        if a is None and name == "alibi_slopes":
            continue
        check_array(a, name)
        dtype = str(getattr(a, "dtype", ""))
        if "float8" in dtype:  # torch.float8_e4m3fn, ml_dtypes.float8_e5m2, ...
            fp8_names = ", ".join(repr(n) for n in KV_CACHE_DTYPES if n != "auto")
            raise TypeError(
                f"{name} has dtype {dtype}: fp8 KV caches are uint8 arrays holding "
                f"the fp8 bytes (torch: cache.view(torch.uint8), numpy: "
                f"cache.view(np.uint8)) with kv_cache_dtype {fp8_names}"
            )


def reshape_and_cache(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    *,
    stream: Any = None,
) -> None:
    """Writes key/value [num_tokens, num_kv_heads, head_size] into vLLM-layout caches
    (key [num_blocks, num_kv_heads, head_size/x, block_size, x], value [num_blocks,
    num_kv_heads, head_size, block_size]) at ``slot_mapping`` (int64; negative = skip)."""
    _arrays(
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_reshape_and_cache(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        False,
        stream_handle(stream, key),
        **arrays,
    )


def reshape_and_cache_flash(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    *,
    stream: Any = None,
) -> None:
    """Same as :func:`reshape_and_cache` for NHD caches [num_blocks, block_size, num_kv_heads,
    head_size]."""
    _arrays(
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_reshape_and_cache(
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        True,
        stream_handle(stream, key),
        **arrays,
    )


def _block_size(key_cache: Any, block_size: Optional[int]) -> None:
    """vLLM passes block_size explicitly: it must agree with the key cache (other shape errors
    are reported by the kernels' validation)."""
    rank = len(key_cache.shape)
    if block_size is None or rank not in (4, 5):
        return
    actual = int(key_cache.shape[3] if rank == 5 else key_cache.shape[1])
    if _int(block_size, "block_size") != actual:
        raise ValueError(
            f"block_size = {block_size} does not match the key_cache's block size {actual}"
        )


def paged_attention_v1(
    out: Any,
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    scale: float,
    block_tables: Any,
    seq_lens: Any,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[Any] = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
    *,
    logits_soft_cap: float = 0.0,
    sliding_window: Optional[int] = None,
    stream: Any = None,
    kernel: str = "auto",
) -> None:
    """Decode attention (one query token per sequence), written into ``out``
    [num_seqs, num_heads, head_size]. Blocksparse attention is not supported."""
    _arrays(
        out=out,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        alibi_slopes=alibi_slopes,
    )
    _no_blocksparse(blocksparse_vert_stride)
    _block_size(key_cache, block_size)
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_paged_attention_v1(
        out,
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _scalar(scale, "scale"),
        block_tables,
        seq_lens,
        _int(max_seq_len, "max_seq_len"),
        alibi_slopes,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        _scalar(logits_soft_cap, "logits_soft_cap"),
        _window(sliding_window),
        stream_handle(stream, query),
        _str(kernel, "kernel"),
        **arrays,
    )


def paged_attention_v2(
    out: Any,
    exp_sums: Any,
    max_logits: Any,
    tmp_out: Any,
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    scale: float,
    block_tables: Any,
    seq_lens: Any,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[Any] = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
    *,
    logits_soft_cap: float = 0.0,
    sliding_window: Optional[int] = None,
    partition_size: int = PARTITION_SIZE,
    stream: Any = None,
    kernel: str = "auto",
) -> None:
    """Partitioned decode attention. exp_sums / max_logits [num_seqs, num_heads, partitions]
    float32 receive each partition's sum of exp(logit - max) and max logit, tmp_out
    [num_seqs, num_heads, partitions, head_size] (float32, or the query dtype) its normalised
    output; partitions past a sequence's end are left untouched. ``out`` gets the merge."""
    _arrays(
        out=out,
        exp_sums=exp_sums,
        max_logits=max_logits,
        tmp_out=tmp_out,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        alibi_slopes=alibi_slopes,
    )
    _no_blocksparse(blocksparse_vert_stride)
    _block_size(key_cache, block_size)
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_paged_attention_v2(
        out,
        exp_sums,
        max_logits,
        tmp_out,
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _scalar(scale, "scale"),
        block_tables,
        seq_lens,
        _int(max_seq_len, "max_seq_len"),
        alibi_slopes,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        _scalar(logits_soft_cap, "logits_soft_cap"),
        _window(sliding_window),
        _int(partition_size, "partition_size"),
        stream_handle(stream, query),
        _str(kernel, "kernel"),
        **arrays,
    )


def paged_attention_balanced(
    out: Any,
    exp_sums: Any,
    max_logits: Any,
    tmp_out: Any,
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    scale: float,
    block_tables: Any,
    seq_lens: Any,
    work_items: Any,
    seq_offsets: Any,
    max_seq_len: int,
    alibi_slopes: Optional[Any] = None,
    kv_cache_dtype: str = "auto",
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    *,
    logits_soft_cap: float = 0.0,
    sliding_window: Optional[int] = None,
    stream: Any = None,
    kernel: str = "auto",
    lse: Optional[Any] = None,
) -> None:
    """Work-balanced decode attention over a plan from ``plan_balanced_decode`` (copied to the
    query's device): work item ``work_items[i]`` = (seq, key_lo, key_hi, row) attends sequence
    seq's keys [key_lo, key_hi) and writes its partial to row ``row`` of exp_sums / max_logits
    [capacity, num_heads] and tmp_out [capacity, num_heads, head_size] (float32); then each
    sequence's rows ``seq_offsets[s] .. seq_offsets[s + 1] - 1`` merge into ``out``. On a GPU it
    runs on the Hopper decode (``kernel`` "auto" or "hopper"; other kernels are refused).
    ``lse`` [num_heads, num_seqs] float32, when given, receives each output row's log-sum-exp
    (for merge_attn_states)."""
    _arrays(
        out=out,
        exp_sums=exp_sums,
        max_logits=max_logits,
        tmp_out=tmp_out,
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=block_tables,
        seq_lens=seq_lens,
        work_items=work_items,
        seq_offsets=seq_offsets,
        alibi_slopes=alibi_slopes,
    )
    if lse is not None:
        _arrays(lse=lse)
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_paged_attention_balanced(
        out,
        exp_sums,
        max_logits,
        tmp_out,
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _scalar(scale, "scale"),
        block_tables,
        seq_lens,
        work_items,
        seq_offsets,
        _int(max_seq_len, "max_seq_len"),
        alibi_slopes,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        _scalar(logits_soft_cap, "logits_soft_cap"),
        _window(sliding_window),
        stream_handle(stream, query),
        _str(kernel, "kernel"),
        **arrays,
        lse=lse,
    )


def merge_attn_states(
    output: Any,
    prefix_output: Any,
    prefix_lse: Any,
    suffix_output: Any,
    suffix_lse: Any,
    output_lse: Optional[Any] = None,
    *,
    stream: Any = None,
) -> None:
    """vLLM's merge_attn_states: ``output`` [num_tokens, num_heads, head_size] = the two
    attention results of the same queries over disjoint keys (prefix_output, suffix_output),
    weighed by their log-sum-exps prefix_lse / suffix_lse [num_heads, num_tokens] float32 (an
    infinite one, no keys, weighs 0); ``output_lse`` receives the merged log-sum-exp."""
    _arrays(
        output=output,
        prefix_output=prefix_output,
        prefix_lse=prefix_lse,
        suffix_output=suffix_output,
        suffix_lse=suffix_lse,
    )
    if output_lse is not None:
        _arrays(output_lse=output_lse)
    _C.ops_merge_attn_states(
        output,
        prefix_output,
        prefix_lse,
        suffix_output,
        suffix_lse,
        output_lse,
        stream_handle(stream, output),
    )


def balanced_plan_capacity(target_items: int, num_seqs: int) -> int:
    """Work items a balanced plan needs room for: ``target_items`` plus one per sequence (each
    sequence's piece count rounds up)."""
    return max(1, _int(target_items, "target_items")) + _int(num_seqs, "num_seqs")


def plan_balanced_decode(
    seq_lens: Any,
    work_items: Any,
    seq_offsets: Any,
    target_items: int,
    sliding_window: Optional[int] = None,
    min_chunk: int = BALANCED_MIN_CHUNK,
) -> int:
    """Fills a work-balanced decode plan in host int32 arrays ``work_items`` [capacity, 4] and
    ``seq_offsets`` [num_seqs + 1] from host int32 ``seq_lens``: every sequence's visible keys
    cut into pieces of near-equal length (total keys / ``target_items``, at least ``min_chunk``,
    in 16-key units), listed longest first as (seq, key_lo, key_hi, row); unused items are
    (-1, 0, 0, -1). Returns the items used."""
    _arrays(seq_lens=seq_lens, work_items=work_items, seq_offsets=seq_offsets)
    return _C.ops_plan_balanced_decode(
        seq_lens,
        work_items,
        seq_offsets,
        _int(target_items, "target_items"),
        _window(sliding_window),
        _int(min_chunk, "min_chunk"),
    )


def balanced_decode_target(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    kv_cache_dtype: str = "auto",
    kernel: str = "auto",
) -> int:
    """The work items a balanced decode runs at once on this call's device (the planner's
    ``target_items``): on a GPU the Hopper decode's resident CTAs over one item's CTAs."""
    _arrays(query=query, key_cache=key_cache, value_cache=value_cache)
    return _C.ops_balanced_decode_target(
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _str(kv_cache_dtype, "kv_cache_dtype"),
        _str(kernel, "kernel"),
    )


def decode_kernel(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    kv_cache_dtype: str = "auto",
    kernel: str = "auto",
) -> str:
    """The kernel paged_attention_v1 / v2 run for this query and these caches on their device
    under the choice ``kernel``: ``"cpu"``, or on a GPU ``"hopper"`` (sm_90, NHD caches),
    ``"tensor_core"`` or ``"cuda_core"`` (with "auto", the first that covers the call;
    docs/kernels.md). A named kernel that does not cover the call raises ValueError."""
    _arrays(query=query, key_cache=key_cache, value_cache=value_cache)
    return _C.ops_decode_kernel(
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _str(kv_cache_dtype, "kv_cache_dtype"),
        _str(kernel, "kernel"),
    )


def decode_partition_size(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    max_seq_len: int,
    kv_cache_dtype: str = "auto",
    kernel: str = "auto",
) -> int:
    """The split-K partition (keys) for paged_attention_v2 on this call's kernel (under the
    choice ``kernel``) and device, or 0 where the single pass (paged_attention_v1) is better. It
    depends on the shapes, dtypes and device alone (not on array values), so a captured CUDA
    graph keeps its choice valid."""
    _arrays(query=query, key_cache=key_cache, value_cache=value_cache)
    return _C.ops_decode_partition_size(
        query,
        key_cache,
        value_cache,
        _int(num_kv_heads, "num_kv_heads"),
        _int(max_seq_len, "max_seq_len"),
        _str(kv_cache_dtype, "kv_cache_dtype"),
        _str(kernel, "kernel"),
    )


def context_attention_fwd(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    kv_cache_dtype: str,
    k_cache: Any,
    v_cache: Any,
    b_loc: Any,
    b_start_loc: Any,
    b_seq_len: Any,
    max_seq_len: Optional[int],
    max_input_len: int,
    k_scale: Any = 1.0,
    v_scale: Any = 1.0,
    alibi_slopes: Optional[Any] = None,
    sliding_window: Optional[int] = None,
    sm_scale: Optional[float] = None,
    skip_decode: bool = False,
    *,
    logits_soft_cap: float = 0.0,
    stream: Any = None,
    kernel: str = "auto",
    causal: bool = True,
) -> None:
    """Prefill / extend attention with a paged prefix (vLLM's prefix_prefill signature).

    q, o: [num_tokens, num_heads, head_size]; k, v: the new tokens [num_tokens, num_kv_heads,
    head_size]; b_loc: block tables [num_seqs, max_blocks] int32; b_start_loc: query_start_loc
    [num_seqs + 1] int32; b_seq_len: seq_lens [num_seqs] int32 (context + new tokens).
    Query token i of a sequence sits at position context_len + i and sees keys 0..itself
    (and, with sliding_window, only the last sliding_window of them); with causal=False
    (encoders) every query token sees all b_seq_len keys of its sequence (sliding_window must be
    None). sm_scale defaults to 1/sqrt(head_size). max_seq_len is unused (accepted for vLLM
    compatibility).
    """
    _arrays(
        q=q,
        k=k,
        v=v,
        o=o,
        k_cache=k_cache,
        v_cache=v_cache,
        b_loc=b_loc,
        b_start_loc=b_start_loc,
        b_seq_len=b_seq_len,
        alibi_slopes=alibi_slopes,
    )
    if skip_decode:
        raise ValueError("skip_decode=True is not supported")
    if sm_scale is None:  # q's rank is checked by the op; a rank-0 q has no head size
        scale = 1.0 / math.sqrt(max(1, int(q.shape[-1]))) if len(q.shape) else 1.0
    else:
        scale = _scalar(sm_scale, "sm_scale")
    ks, vs, arrays = _scale_args(k_scale, v_scale)
    _C.ops_context_attention_fwd(
        o,
        q,
        k,
        v,
        k_cache,
        v_cache,
        b_loc,
        b_start_loc,
        b_seq_len,
        _int(max_input_len, "max_input_len"),
        scale,
        alibi_slopes,
        _str(kv_cache_dtype, "kv_cache_dtype"),
        ks,
        vs,
        _scalar(logits_soft_cap, "logits_soft_cap"),
        _window(sliding_window),
        stream_handle(stream, q),
        _str(kernel, "kernel"),
        causal=_bool(causal, "causal"),
        **arrays,
    )


def copy_blocks(
    key_caches: Sequence[Any],
    value_caches: Sequence[Any],
    block_mapping: Any,
    *,
    stream: Any = None,
) -> None:
    """Copies blocks block_mapping[i, 0] -> block_mapping[i, 1] ([n, 2] int64) in every
    layer's key and value cache. Pairs run in order, except with a CUDA block_mapping, whose
    pairs run in parallel and must be independent (no destination that is another pair's
    source or appears twice); see include/pagedkv/ops.h."""
    for name, caches in (("key_caches", key_caches), ("value_caches", value_caches)):
        if not isinstance(caches, (list, tuple)):
            raise TypeError(f"{name} must be a list of arrays, got {type(caches).__name__}")
        _arrays(**{f"{name}[{i}]": c for i, c in enumerate(caches)})
    _arrays(block_mapping=block_mapping)
    first = key_caches[0] if key_caches else block_mapping
    _C.ops_copy_blocks(
        list(key_caches), list(value_caches), block_mapping, stream_handle(stream, first)
    )


def swap_blocks(src: Any, dst: Any, block_mapping: Any, *, stream: Any = None) -> None:
    """Copies blocks block_mapping[i, 0] of ``src`` to block_mapping[i, 1] of ``dst``
    (block_mapping: [n, 2] int64 on the CPU); src/dst may be on different devices."""
    _arrays(src=src, dst=dst, block_mapping=block_mapping)
    gpu = dst if is_cuda(dst) else src
    _C.ops_swap_blocks(src, dst, block_mapping, stream_handle(stream, gpu))


def _no_blocksparse(vert_stride: Optional[int]) -> None:
    if vert_stride is not None and vert_stride > 1:
        raise ValueError("blocksparse_vert_stride > 1: blocksparse attention is not supported")


# The mixture-of-experts and int4 kernels live in their own modules (one concept per file).
from pagedkv.lora_ops import lora_expand, lora_shrink  # noqa: E402
from pagedkv.moe_ops import (  # noqa: E402
    moe_align_block_size,
    moe_grouped_gemm,
    moe_max_padded_tokens,
    topk_softmax,
)
from pagedkv.quant_ops import int4_gemm  # noqa: E402

__all__ += [
    "topk_softmax",
    "moe_align_block_size",
    "moe_grouped_gemm",
    "moe_max_padded_tokens",
    "int4_gemm",
    "lora_shrink",
    "lora_expand",
]
