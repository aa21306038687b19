"""``PagedAttention``: vLLM's paged-attention front end (seed 001) over pagedkv's kernels.

The static methods keep vLLM's names and argument order, so model code written for vLLM's
``PagedAttention`` runs unchanged. They accept torch tensors (CPU now, CUDA when built), numpy
and cupy arrays; outputs are allocated in the caller's framework on the caller's device.
Keyword-only extras (``logits_soft_cap``, ``sliding_window``, ``scale``, ``stream``) come last.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, List, Optional, Tuple

from pagedkv import _tensor, ops
from pagedkv._C import build_info

_PARTITION_SIZE = ops.PARTITION_SIZE
# The tensor-core CUDA decode (src/ops/cuda/decode_mma.cuh) is the default; PAGEDKV_DECODE_MMA=0
# selects the CUDA-core kernel (the default mirrors kMmaDecodeDefault in decode_mma.cu).
_MMA_DECODE_DEFAULT = True


def mma_decode_enabled() -> bool:
    """True when CUDA decode of fp16/bf16 queries runs on the tensor-core kernel
    (PAGEDKV_DECODE_MMA=1; 0 = the CUDA-core kernel)."""
    value = os.environ.get("PAGEDKV_DECODE_MMA", "").strip()
    if not value:
        return _MMA_DECODE_DEFAULT
    try:
        return int(value) != 0
    except ValueError:
        return False  # what the C++ side's atoi reads


def decode_partition_size(num_seqs: int, num_heads: int, num_kv_heads: int, max_seq_len: int,
                          block_size: int, num_sms: int,
                          tensor_cores: Optional[bool] = None,
                          kv_cache_dtype: str = "auto", hopper: bool = False) -> int:
    """Split-K partition size for CUDA decode; 0 = single pass (paged_attention_v1).

    Every CUDA kernel runs one CTA per (sequence, KV head, query-head chunk, partition). When
    the unsplit grid leaves the GPU under-filled, the context is cut into slots // CTAs
    partitions (whole waves: no half-empty tail wave), for `per_sm` CTAs per SM:
    - the Hopper kernel (``hopper``, see hopper_decode_runs) streams a 16-bit cache at full
      bandwidth from one CTA per SM, so it splits only to reach that; an fp8 cache, half the
      bytes per key for the same math, wants every CTA slot filled (4 per SM) and partitions
      of at least 256 keys. Within 2 % of the best fixed size on every benchmark shape
      (benchmarks/RESULTS.md, decode_variants.py --partitions --every-shape);
    - the tensor-core kernel (up to 16 query heads per CTA): 2 CTAs per SM, 4 with fp8;
    - the CUDA-core kernel (8 query heads per CTA) is issue-bound and wants ~8 CTAs per SM.
    Partitions are multiples of 16 keys and of block_size, at least 128 keys (256 for the Hopper
    kernel with an fp8 cache)."""
    if tensor_cores is None:
        tensor_cores = mma_decode_enabled()
    fp8 = kv_cache_dtype.startswith("fp8")
    if hopper:
        heads_per_cta, per_sm = 16, 4 if fp8 else 1
    elif tensor_cores:
        heads_per_cta, per_sm = 16, 4 if fp8 else 2
    else:
        heads_per_cta, per_sm = 8, 8
    group = max(1, num_heads // max(1, num_kv_heads))
    ctas = max(1, num_seqs * num_kv_heads * math.ceil(group / heads_per_cta))
    parts = per_sm * num_sms // ctas
    if max_seq_len <= 0:
        return 0
    unit = block_size * 16 // math.gcd(block_size, 16)
    size = 0
    least = 256 if hopper and fp8 else 128
    if parts >= 2:
        size = max(math.ceil(max_seq_len / parts / unit) * unit, math.ceil(least / unit) * unit)
    return 0 if size >= max_seq_len else size


def hopper_decode_runs(query: Any, nhd_cache: bool) -> bool:
    """Whether CUDA decode of ``query`` takes the Hopper kernel (src/ops/cuda/decode_bulk.cuh):
    fp16 / bf16 queries on a compute capability 9.x GPU, a build with sm_90a code, an NHD
    (row-layout) cache and PAGEDKV_DECODE_BULK not 0. It mirrors the C++ side's choice only to
    size the split (decode_partition_size): a wrong guess costs speed, never correctness."""
    if not nhd_cache or not _tensor.is_cuda(query):
        return False
    if _tensor.dtype_name(query) not in ("float16", "bfloat16"):
        return False
    value = os.environ.get("PAGEDKV_DECODE_BULK", "").strip()
    try:
        if value and int(value) == 0:
            return False
    except ValueError:
        return False  # what the C++ side's atoi reads: 0
    device = int(query.__dlpack_device__()[1])
    return _compute_major(_tensor.framework(query), device) == 9 and _built_for_sm90a()


@functools.cache
def _built_for_sm90a() -> bool:
    return "90a" in build_info()["cuda_archs"]  # the build cannot change while loaded


@functools.cache
def _compute_major(framework: str, device: int) -> int:
    if framework == "torch":
        import torch

        return int(torch.cuda.get_device_capability(device)[0])
    if framework == "cupy":
        import cupy

        return int(cupy.cuda.Device(device).compute_capability) // 10
    return 0


@functools.cache
def _sm_count(framework: str, device: int) -> int:
    if framework == "torch":
        import torch

        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    if framework == "cupy":
        import cupy

        return int(cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"])
    return 132  # an H100 SXM


def _num_sms(x: Any) -> int:
    """Multiprocessors of the GPU holding ``x``."""
    return _sm_count(_tensor.framework(x), int(x.__dlpack_device__()[1]))


def _element_size(x: Any) -> int:
    if hasattr(x, "element_size"):  # torch
        return int(x.element_size())
    return int(x.dtype.itemsize)  # numpy, cupy


def _view(x: Any, shape: Tuple[int, ...]) -> Any:
    """A view of contiguous ``x`` with a new shape (torch .view, numpy / cupy .reshape)."""
    if _tensor.framework(x) == "torch":
        return x.view(*shape)
    return x.reshape(shape)


class PagedAttention:
    @staticmethod
    def get_supported_head_sizes() -> List[int]:
        return [32, 64, 80, 96, 112, 120, 128, 192, 256]

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                           head_size: int) -> Tuple[int, ...]:
        return (2, num_blocks, block_size * num_kv_heads * head_size)

    @staticmethod
    def split_kv_cache(kv_cache: Any, num_kv_heads: int, head_size: int) -> Tuple[Any, Any]:
        """Views of a [2, num_blocks, block_size * num_kv_heads * head_size] cache as the vLLM
        layout: key [num_blocks, num_kv_heads, head_size/x, block_size, x] and value
        [num_blocks, num_kv_heads, head_size, block_size], x = 16 // element size."""
        x = 16 // _element_size(kv_cache)
        num_blocks = int(kv_cache.shape[1])
        key_cache = _view(kv_cache[0], (num_blocks, num_kv_heads, head_size // x, -1, x))
        value_cache = _view(kv_cache[1], (num_blocks, num_kv_heads, head_size, -1))
        return key_cache, value_cache

    @staticmethod
    def write_to_paged_cache(key: Any, value: Any, key_cache: Any, value_cache: Any,
                             slot_mapping: Any, kv_cache_dtype: str, k_scale: Any, v_scale: Any,
                             *, stream: Optional[int] = None) -> None:
        _tensor.check_array(slot_mapping, "slot_mapping")
        ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping.reshape(-1),
                              kv_cache_dtype, k_scale, v_scale, stream=stream)

    @staticmethod
    def forward_decode(query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                       seq_lens: Any, max_seq_len: int, kv_cache_dtype: str, num_kv_heads: int,
                       scale: float, alibi_slopes: Optional[Any], k_scale: Any, v_scale: Any,
                       tp_rank: int = 0, blocksparse_local_blocks: int = 0,
                       blocksparse_vert_stride: int = 0, blocksparse_block_size: int = 64,
                       blocksparse_head_sliding_step: int = 0, *,
                       logits_soft_cap: float = 0.0, sliding_window: Optional[int] = None,
                       stream: Optional[int] = None) -> Any:
        """Decode attention; returns the output [num_seqs, num_heads, head_size] like query.
        On CUDA the split-K partition comes from decode_partition_size (split only when the
        batch leaves the GPU under-filled); on the CPU it is vLLM's: the single-pass kernel
        unless the context spans several 512-token partitions and the batch is small, or
        max_seq_len > 8192."""
        _tensor.check_array(query, "query")
        _tensor.check_array(key_cache, "key_cache")
        output = _tensor.empty(query.shape, _tensor.dtype_name(query), like=query)
        block_size = int(key_cache.shape[3] if len(key_cache.shape) == 5 else key_cache.shape[1])
        num_seqs, num_heads, head_size = (int(s) for s in query.shape)
        if _tensor.is_cuda(query):
            hopper = hopper_decode_runs(query, nhd_cache=len(key_cache.shape) == 4)
            partition_size = decode_partition_size(num_seqs, num_heads, num_kv_heads,
                                                   max_seq_len, block_size, _num_sms(query),
                                                   kv_cache_dtype=kv_cache_dtype, hopper=hopper)
            use_v1 = partition_size == 0
        else:
            partition_size = _PARTITION_SIZE
            max_parts = (max_seq_len + _PARTITION_SIZE - 1) // _PARTITION_SIZE
            use_v1 = max_seq_len <= 8192 and (max_parts == 1 or num_seqs * num_heads > 512)
        max_num_partitions = (max_seq_len + partition_size - 1) // max(1, partition_size)
        common = dict(logits_soft_cap=logits_soft_cap, sliding_window=sliding_window,
                      stream=stream)
        if use_v1:
            ops.paged_attention_v1(output, query, key_cache, value_cache, num_kv_heads, scale,
                                   block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
                                   kv_cache_dtype, k_scale, v_scale, tp_rank,
                                   blocksparse_local_blocks, blocksparse_vert_stride,
                                   blocksparse_block_size, blocksparse_head_sliding_step,
                                   **common)
        else:
            # Partial outputs stay in float32 until the fp32 merge (vLLM keeps them in the
            # query dtype and loses precision there).
            tmp_output = _tensor.empty((num_seqs, num_heads, max_num_partitions, head_size),
                                       "float32", like=query)
            exp_sums = _tensor.empty((num_seqs, num_heads, max_num_partitions), "float32",
                                     like=query)
            max_logits = _tensor.empty((num_seqs, num_heads, max_num_partitions), "float32",
                                       like=query)
            ops.paged_attention_v2(output, exp_sums, max_logits, tmp_output, query, key_cache,
                                   value_cache, num_kv_heads, scale, block_tables, seq_lens,
                                   block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
                                   k_scale, v_scale, tp_rank, blocksparse_local_blocks,
                                   blocksparse_vert_stride, blocksparse_block_size,
                                   blocksparse_head_sliding_step,
                                   partition_size=partition_size, **common)
        return _tensor.finish(output, query)

    @staticmethod
    def forward_prefix(query: Any, key: Any, value: Any, kv_cache_dtype: str, key_cache: Any,
                       value_cache: Any, block_tables: Any, query_start_loc: Any,
                       seq_lens_tensor: Any, max_query_len: int, alibi_slopes: Optional[Any],
                       sliding_window: Optional[int], k_scale: Any, v_scale: Any, *,
                       scale: Optional[float] = None, logits_soft_cap: float = 0.0,
                       stream: Optional[int] = None) -> Any:
        """Prefill / extend attention: the new tokens (query/key/value [num_tokens, heads,
        head_size]) attend causally to their sequence's cached context and to themselves.
        Returns the output like query. scale defaults to 1/sqrt(head_size)."""
        _tensor.check_array(query, "query")
        output = _tensor.empty(query.shape, _tensor.dtype_name(query), like=query)
        sm_scale = 1.0 / math.sqrt(int(query.shape[-1])) if scale is None else float(scale)
        ops.context_attention_fwd(query, key, value, output, kv_cache_dtype, key_cache,
                                  value_cache, block_tables, query_start_loc, seq_lens_tensor,
                                  None, max_query_len, k_scale, v_scale, alibi_slopes,
                                  sliding_window, sm_scale, logits_soft_cap=logits_soft_cap,
                                  stream=stream)
        return _tensor.finish(output, query)

    @staticmethod
    def swap_blocks(src_kv_cache: Any, dst_kv_cache: Any, src_to_dst: Any, *,
                    stream: Optional[int] = None) -> None:
        ops.swap_blocks(src_kv_cache[0], dst_kv_cache[0], src_to_dst, stream=stream)
        ops.swap_blocks(src_kv_cache[1], dst_kv_cache[1], src_to_dst, stream=stream)

    @staticmethod
    def copy_blocks(kv_caches: List[Any], src_to_dists: Any, *,
                    stream: Optional[int] = None) -> None:
        key_caches = [kv_cache[0] for kv_cache in kv_caches]
        value_caches = [kv_cache[1] for kv_cache in kv_caches]
        ops.copy_blocks(key_caches, value_caches, src_to_dists, stream=stream)
