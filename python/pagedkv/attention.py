"""``PagedAttention``: vLLM's paged-attention front end over pagedkv's kernels.

The static methods keep vLLM's names and argument order, so model code written for vLLM's
``PagedAttention`` runs unchanged. They accept torch tensors (CPU now, CUDA when built), numpy
and cupy arrays; outputs are allocated in the caller's framework on the caller's device.
Keyword-only extras (``logits_soft_cap``, ``sliding_window``, ``scale``, ``stream``, ``kernel``:
see pagedkv.ops) come last. The caches may use either layout (vLLM 5-D or NHD 4-D, told apart by
the key cache's rank) in every method.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any, List, Optional, Tuple

import numpy as np

from pagedkv import _C, _tensor, balanced_decode, ops

_PARTITION_SIZE = ops.PARTITION_SIZE
_CACHE_LAYOUTS = (
    "vLLM [num_blocks, num_kv_heads, head_size/x, block_size, x] or NHD "
    "[num_blocks, block_size, num_kv_heads, head_size]"
)


def decode_partition_size(
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    max_seq_len: int,
    block_size: int,
    num_sms: int,
    kernel: str,
    kv_cache_dtype: str = "auto",
) -> int:
    """The library's split-K rule (C++ ``pagedkv::ops::decode_partition_size``, documented in
    include/pagedkv/ops.h) for a given decode kernel (one of ops.ATTENTION_KERNELS but "auto";
    see ops.decode_kernel) on a GPU of ``num_sms`` multiprocessors: the
    partition for paged_attention_v2, or 0 for the single pass. A call's own choice is
    ops.decode_partition_size(query, key_cache, value_cache, ...)."""
    if not isinstance(kernel, str):
        raise TypeError(f"kernel must be a str, got {type(kernel).__name__}")
    return _C.ops_decode_partition_rule(
        kernel,
        ops._int(num_seqs, "num_seqs"),
        ops._int(num_heads, "num_heads"),
        ops._int(num_kv_heads, "num_kv_heads"),
        ops._int(max_seq_len, "max_seq_len"),
        ops._int(block_size, "block_size"),
        ops._int(num_sms, "num_sms"),
        ops._str(kv_cache_dtype, "kv_cache_dtype"),
    )


def _element_size(x: Any) -> int:
    if hasattr(x, "element_size"):  # torch
        return int(x.element_size())
    return int(x.dtype.itemsize)  # numpy, cupy


def _check_rank(x: Any, name: str, ranks: Tuple[int, ...], layout: str) -> None:
    """ValueError naming the argument when ``x`` (an array) has none of ``ranks``: the methods
    read shapes before the ops validate them."""
    if len(x.shape) not in ranks:
        raise ValueError(
            f"{name} must have rank {' or '.join(map(str, ranks))} ({layout}), got "
            f"shape {tuple(int(s) for s in x.shape)}"
        )


def _view(x: Any, shape: Tuple[int, ...]) -> Any:
    """A view of contiguous ``x`` with a new shape (torch .view, numpy / cupy .reshape)."""
    if _tensor.framework(x) == "torch":
        return x.view(*shape)
    return x.reshape(shape)


def _host_int32(x: Any) -> np.ndarray:
    """An int array as host int32 numpy (a device array is copied: a synchronisation)."""
    if hasattr(x, "detach"):  # torch
        return x.detach().cpu().numpy().astype(np.int32, copy=False)
    if hasattr(x, "get") and _tensor.is_cuda(x):  # cupy
        return np.asarray(x.get(), dtype=np.int32)
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def _like(a: np.ndarray, like: Any) -> Any:
    """A host numpy array in like's framework, on like's device."""
    fw = _tensor.framework(like)
    if fw == "torch":
        import torch

        return torch.from_numpy(a).to(like.device)
    if fw == "cupy":  # (a cupy array means cupy is imported)
        return sys.modules["cupy"].asarray(a)
    return a


def _balanced_plan(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    num_kv_heads: int,
    kv_cache_dtype: str,
    kernel: str,
    seq_lens: Any,
    seq_lens_cpu: Optional[Any],
    sliding_window: Optional[int],
    schedule: str,
    partition_size: int,
) -> Optional[Tuple[Any, Any, int]]:
    """forward_decode's balanced plan (work_items, seq_offsets on query's device, capacity), or
    None where the call takes the partition split (module pagedkv.balanced_decode)."""
    if schedule == "partition":
        return None
    runs = ops.decode_kernel(query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel)
    if runs not in ("cpu", "hopper"):
        if schedule == "balanced":
            raise ValueError(
                f"schedule 'balanced' runs on the Hopper decode (or the CPU), but this call "
                f"runs on kernel '{runs}'"
            )
        return None
    host_lens = seq_lens_cpu is not None or not _tensor.is_cuda(seq_lens)
    if schedule == "auto" and (runs == "cpu" or not host_lens):
        return None  # auto: on a GPU, and only where the lengths need no synchronisation
    lens = _host_int32(seq_lens_cpu if seq_lens_cpu is not None else seq_lens)
    target = balanced_decode.target_items(
        query, key_cache, value_cache, num_kv_heads, kv_cache_dtype, kernel
    )
    cap = ops.balanced_plan_capacity(target, lens.shape[0])
    items = np.empty((cap, ops.BALANCED_ITEM_INTS), np.int32)
    offsets = np.empty(lens.shape[0] + 1, np.int32)
    used = ops.plan_balanced_decode(lens, items, offsets, target, sliding_window)
    window = sliding_window or 0
    if schedule == "auto" and not balanced_decode.prefers_balanced(
        lens, partition_size, items, used, window
    ):
        return None
    return _like(items, query), _like(offsets, query), cap


class PagedAttention:
    @staticmethod
    def get_supported_head_sizes() -> List[int]:
        return list(ops.SUPPORTED_HEAD_SIZES)

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> Tuple[int, ...]:
        """(2, num_blocks, block_size * num_kv_heads * head_size); every size a positive
        integer (a float, zero or a negative size would give a shape no cache can have)."""
        sizes = {
            "num_blocks": num_blocks,
            "block_size": block_size,
            "num_kv_heads": num_kv_heads,
            "head_size": head_size,
        }
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        return (2, int(num_blocks), int(block_size) * int(num_kv_heads) * int(head_size))

    @staticmethod
    def split_kv_cache(kv_cache: Any, num_kv_heads: int, head_size: int) -> Tuple[Any, Any]:
        """Views of a [2, num_blocks, block_size * num_kv_heads * head_size] cache as the vLLM
        layout: key [num_blocks, num_kv_heads, head_size/x, block_size, x] and value
        [num_blocks, num_kv_heads, head_size, block_size], x = 16 // element size."""
        _tensor.check_array(kv_cache, "kv_cache")
        num_kv_heads = ops._int(num_kv_heads, "num_kv_heads")
        head_size = ops._int(head_size, "head_size")
        shape = tuple(int(s) for s in kv_cache.shape)
        if len(shape) != 3 or shape[0] != 2:
            raise ValueError(
                f"kv_cache must have shape (2, num_blocks, block_size * num_kv_heads "
                f"* head_size) (get_kv_cache_shape), got {shape}"
            )
        x = 16 // _element_size(kv_cache)
        if num_kv_heads <= 0 or head_size <= 0 or head_size % x:
            raise ValueError(
                f"num_kv_heads = {num_kv_heads} and head_size = {head_size} must be "
                f"positive, head_size a multiple of x = 16 // element size = {x}"
            )
        if shape[2] % (num_kv_heads * head_size):
            raise ValueError(
                f"kv_cache holds {shape[2]} elements per block, not a multiple of "
                f"num_kv_heads * head_size = {num_kv_heads} * {head_size}"
            )
        num_blocks = shape[1]
        key_cache = _view(kv_cache[0], (num_blocks, num_kv_heads, head_size // x, -1, x))
        value_cache = _view(kv_cache[1], (num_blocks, num_kv_heads, head_size, -1))
        return key_cache, value_cache

    @staticmethod
    def write_to_paged_cache(
        key: Any,
        value: Any,
        key_cache: Any,
        value_cache: Any,
        slot_mapping: Any,
        kv_cache_dtype: str,
        k_scale: Any,
        v_scale: Any,
        *,
        stream: Any = None,
    ) -> None:
        """Writes key/value [num_tokens, num_kv_heads, head_size] at slot_mapping into caches of
        either layout (vLLM 5-D: reshape_and_cache; NHD 4-D: reshape_and_cache_flash)."""
        _tensor.check_array(slot_mapping, "slot_mapping")
        _tensor.check_array(key_cache, "key_cache")
        _check_rank(key_cache, "key_cache", (5, 4), _CACHE_LAYOUTS)
        write = ops.reshape_and_cache if len(key_cache.shape) == 5 else ops.reshape_and_cache_flash
        write(
            key,
            value,
            key_cache,
            value_cache,
            slot_mapping.reshape(-1),
            kv_cache_dtype,
            k_scale,
            v_scale,
            stream=stream,
        )

    @staticmethod
    def forward_decode(
        query: Any,
        key_cache: Any,
        value_cache: Any,
        block_tables: Any,
        seq_lens: Any,
        max_seq_len: int,
        kv_cache_dtype: str,
        num_kv_heads: int,
        scale: float,
        alibi_slopes: Optional[Any],
        k_scale: Any,
        v_scale: Any,
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
        schedule: str = "auto",
        seq_lens_cpu: Optional[Any] = None,
    ) -> Any:
        """Decode attention; returns the output [num_seqs, num_heads, head_size] like query.
        The split-K partition is the library's (ops.decode_partition_size): on CUDA, split only
        when the batch leaves the GPU under-filled, for the kernel that runs; on the CPU,
        vLLM's rule: the single pass unless the context spans several 512-token partitions and
        the batch is small, or max_seq_len > 8192.

        ``schedule`` (pagedkv.balanced_decode): "partition" is the split above; "balanced" runs
        ops.paged_attention_balanced over a plan made here from the host lengths
        (``seq_lens_cpu``, else seq_lens itself, copied to the host: a synchronisation) on the
        Hopper decode or the CPU (another kernel raises ValueError); "auto" takes the balanced
        plan on a GPU where the host lengths are at hand (``seq_lens_cpu`` or host seq_lens) and
        balanced_decode.prefers_balanced says it wins (skewed batches), else the split."""
        _tensor.check_array(query, "query")
        _tensor.check_array(key_cache, "key_cache")
        _check_rank(query, "query", (3,), "[num_seqs, num_heads, head_size]")
        _check_rank(key_cache, "key_cache", (5, 4), _CACHE_LAYOUTS)
        max_seq_len = ops._int(max_seq_len, "max_seq_len")
        num_kv_heads = ops._int(num_kv_heads, "num_kv_heads")
        output = _tensor.empty(query.shape, _tensor.dtype_name(query), like=query)
        block_size = int(key_cache.shape[3] if len(key_cache.shape) == 5 else key_cache.shape[1])
        num_seqs, num_heads, head_size = (int(s) for s in query.shape)
        partition_size = ops.decode_partition_size(
            query, key_cache, value_cache, num_kv_heads, max_seq_len, kv_cache_dtype, kernel
        )
        plan = _balanced_plan(
            query,
            key_cache,
            value_cache,
            num_kv_heads,
            kv_cache_dtype,
            kernel,
            seq_lens,
            seq_lens_cpu,
            sliding_window,
            balanced_decode.check_schedule(schedule),
            partition_size,
        )
        if plan is not None:
            items, offsets, cap = plan
            ops.paged_attention_balanced(
                output,
                _tensor.empty((cap, num_heads), "float32", like=query),
                _tensor.empty((cap, num_heads), "float32", like=query),
                _tensor.empty((cap, num_heads, head_size), "float32", like=query),
                query,
                key_cache,
                value_cache,
                num_kv_heads,
                scale,
                block_tables,
                seq_lens,
                items,
                offsets,
                max_seq_len,
                alibi_slopes,
                kv_cache_dtype,
                k_scale,
                v_scale,
                logits_soft_cap=logits_soft_cap,
                sliding_window=sliding_window,
                stream=stream,
                kernel=kernel,
            )
            return _tensor.finish(output, query)
        use_v1 = partition_size == 0
        max_num_partitions = (max_seq_len + partition_size - 1) // max(1, partition_size)
        common = dict(
            logits_soft_cap=logits_soft_cap,
            sliding_window=sliding_window,
            stream=stream,
            kernel=kernel,
        )
        if use_v1:
            ops.paged_attention_v1(
                output,
                query,
                key_cache,
                value_cache,
                num_kv_heads,
                scale,
                block_tables,
                seq_lens,
                block_size,
                max_seq_len,
                alibi_slopes,
                kv_cache_dtype,
                k_scale,
                v_scale,
                tp_rank,
                blocksparse_local_blocks,
                blocksparse_vert_stride,
                blocksparse_block_size,
                blocksparse_head_sliding_step,
                **common,
            )
        else:
            # Partial outputs stay in float32 until the fp32 merge (vLLM keeps them in the
            # query dtype and loses precision there).
            tmp_output = _tensor.empty(
                (num_seqs, num_heads, max_num_partitions, head_size), "float32", like=query
            )
            exp_sums = _tensor.empty(
                (num_seqs, num_heads, max_num_partitions), "float32", like=query
            )
            max_logits = _tensor.empty(
                (num_seqs, num_heads, max_num_partitions), "float32", like=query
            )
            ops.paged_attention_v2(
                output,
                exp_sums,
                max_logits,
                tmp_output,
                query,
                key_cache,
                value_cache,
                num_kv_heads,
                scale,
                block_tables,
                seq_lens,
                block_size,
                max_seq_len,
                alibi_slopes,
                kv_cache_dtype,
                k_scale,
                v_scale,
                tp_rank,
                blocksparse_local_blocks,
                blocksparse_vert_stride,
                blocksparse_block_size,
                blocksparse_head_sliding_step,
                partition_size=partition_size,
                **common,
            )
        return _tensor.finish(output, query)

    @staticmethod
    def forward_prefix(
        query: Any,
        key: Any,
        value: Any,
        kv_cache_dtype: str,
        key_cache: Any,
        value_cache: Any,
        block_tables: Any,
        query_start_loc: Any,
        seq_lens_tensor: Any,
        max_query_len: int,
        alibi_slopes: Optional[Any],
        sliding_window: Optional[int],
        k_scale: Any,
        v_scale: Any,
        *,
        scale: Optional[float] = None,
        logits_soft_cap: float = 0.0,
        stream: Any = None,
        kernel: str = "auto",
        causal: bool = True,
    ) -> Any:
        """Prefill / extend attention: the new tokens (query/key/value [num_tokens, heads,
        head_size]) attend causally to their sequence's cached context and to themselves
        (causal=False, for encoders: to all of their sequence's keys). Returns the output like
        query. scale defaults to 1/sqrt(head_size)."""
        _tensor.check_array(query, "query")
        _check_rank(query, "query", (3,), "[num_tokens, num_heads, head_size]")
        output = _tensor.empty(query.shape, _tensor.dtype_name(query), like=query)
        sm_scale = (
            1.0 / math.sqrt(max(1, int(query.shape[-1])))
            if scale is None
            else ops._scalar(scale, "scale")
        )
        ops.context_attention_fwd(
            query,
            key,
            value,
            output,
            kv_cache_dtype,
            key_cache,
            value_cache,
            block_tables,
            query_start_loc,
            seq_lens_tensor,
            None,
            max_query_len,
            k_scale,
            v_scale,
            alibi_slopes,
            sliding_window,
            sm_scale,
            logits_soft_cap=logits_soft_cap,
            stream=stream,
            kernel=kernel,
            causal=causal,
        )
        return _tensor.finish(output, query)

    @staticmethod
    def swap_blocks(
        src_kv_cache: Any, dst_kv_cache: Any, src_to_dst: Any, *, stream: Any = None
    ) -> None:
        ops.swap_blocks(src_kv_cache[0], dst_kv_cache[0], src_to_dst, stream=stream)
        ops.swap_blocks(src_kv_cache[1], dst_kv_cache[1], src_to_dst, stream=stream)

    @staticmethod
    def copy_blocks(kv_caches: List[Any], src_to_dists: Any, *, stream: Any = None) -> None:
        key_caches = [kv_cache[0] for kv_cache in kv_caches]
        value_caches = [kv_cache[1] for kv_cache in kv_caches]
        ops.copy_blocks(key_caches, value_caches, src_to_dists, stream=stream)
