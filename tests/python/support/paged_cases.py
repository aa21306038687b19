"""Random paged-attention test cases shared by the CPU and CUDA op tests.

A case holds the arrays in the framework under test (numpy or torch, on `device`) plus float64
numpy copies of what the kernels actually see (after rounding to the storage dtype), so the
reference measures only the kernels' own error. Cache slots that no sequence uses are poisoned
(NaN, or the fp8 NaN code) so that reading them shows up as a NaN in the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from support import reference_attention as ref

FP8_NAN = {"e4m3": 0x7F, "e5m2": 0x7E}


def np_dtype(dtype: str) -> Any:
    return {"float32": np.float32, "float16": np.float16}[dtype]


def to_fw(a: np.ndarray, fw: str, dtype: str, device: str = "cpu") -> Any:
    """numpy float64/uint8/int array -> array of `dtype` in framework fw."""
    if fw == "numpy":
        return np.ascontiguousarray(a.astype(dtype if dtype != "bfloat16" else np.float32))
    import torch

    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device=device, dtype=getattr(torch, dtype))


def to_np(x: Any) -> np.ndarray:
    """Any array -> numpy (float arrays as float64, others unchanged)."""
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.double()
        return x.numpy()
    a = np.asarray(x)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def empty_like_fw(
    shape: tuple, fw: str, dtype: str, device: str = "cpu", fill: float = np.nan
) -> Any:
    return to_fw(np.full(shape, fill), fw, dtype, device)


@dataclass
class PagedKV:
    layout: str  # "vllm" or "nhd"
    kv_cache_dtype: str
    key_cache: Any
    value_cache: Any
    k_dense: np.ndarray  # float64 [num_blocks, block_size, kvh, D], what the kernel reads
    v_dense: np.ndarray
    block_tables: Any
    block_tables_np: np.ndarray
    k_scale: float = 1.0
    v_scale: float = 1.0
    extra: dict = field(default_factory=dict)


def make_paged_kv(
    rng: np.random.Generator,
    fw: str,
    dtype: str,
    layout: str,
    kv_cache_dtype: str,
    seq_lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_size: int,
    device: str = "cpu",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    spare_blocks: int = 3,
    table_pad: int = 2,
) -> PagedKV:
    """Caches holding random keys/values for the first seq_lens[i] tokens of each sequence
    (distinct, shuffled blocks); everything else poisoned. Block-table padding holds an
    out-of-range id (the kernels must not read it)."""
    bs, h, d = block_size, num_kv_heads, head_size
    need = [(n + bs - 1) // bs for n in seq_lens]
    num_blocks = sum(need) + spare_blocks
    perm = rng.permutation(num_blocks)
    max_blocks = max(need + [0]) + table_pad
    tables = np.full((len(seq_lens), max_blocks), num_blocks + 1000, dtype=np.int32)
    used = np.zeros((num_blocks, bs), bool)
    pos = 0
    for i, n in enumerate(seq_lens):
        tables[i, : need[i]] = perm[pos : pos + need[i]]
        for t in range(n):
            used[tables[i, t // bs], t % bs] = True
        pos += need[i]
    caches, denses = [], []
    for is_key, scale in ((True, k_scale), (False, v_scale)):
        vals = rng.standard_normal((num_blocks, bs, h, d))
        if kv_cache_dtype == "auto":
            vals = np.where(used[:, :, None, None], vals, np.nan)
            stored = vals
            store_dtype = dtype
        else:
            fmt = ref.fp8_format(kv_cache_dtype)
            stored = ref.fp8_encode(vals / scale, fmt)
            stored = np.where(used[:, :, None, None], stored, FP8_NAN[fmt]).astype(np.uint8)
            store_dtype = "uint8"
        elem = 1 if store_dtype == "uint8" else (4 if store_dtype == "float32" else 2)
        x = 16 // elem
        if layout == "vllm":
            if is_key:
                laid = stored.reshape(num_blocks, bs, h, d // x, x).transpose(0, 2, 3, 1, 4)
            else:
                laid = stored.transpose(0, 2, 3, 1)
        else:
            laid = stored
        laid = np.ascontiguousarray(laid)
        cache = to_fw(laid, fw, store_dtype, device)
        caches.append(cache)
        denses.append(
            ref.dense_cache(
                to_np(cache) if kv_cache_dtype == "auto" else to_np(cache).astype(np.uint8),
                is_key,
                layout,
                kv_cache_dtype,
                scale,
            )
        )
    bt = to_fw(tables, fw, "int32", device)
    return PagedKV(
        layout,
        kv_cache_dtype,
        caches[0],
        caches[1],
        denses[0],
        denses[1],
        bt,
        tables,
        k_scale,
        v_scale,
    )


def rand_array(
    rng: np.random.Generator,
    shape: tuple,
    fw: str,
    dtype: str,
    device: str = "cpu",
    scale: float = 1.0,
) -> tuple[Any, np.ndarray]:
    """A random array in the framework and its exact float64 value."""
    a = to_fw(rng.standard_normal(shape) * scale, fw, dtype, device)
    return a, to_np(a)


def alibi(
    rng: np.random.Generator, num_heads: int, fw: str, device: str = "cpu"
) -> tuple[Optional[Any], Optional[np.ndarray]]:
    s = rng.uniform(0.01, 0.5, num_heads)
    return to_fw(s, fw, "float32", device), s.astype(np.float32).astype(np.float64)


def tolerance(dtype: str) -> float:
    return 2e-6 if dtype == "float32" else 1e-2


def run_paged_decode(
    version: int,
    out: Any,
    query: Any,
    kv: PagedKV,
    num_kv_heads: int,
    scale: float,
    seq_lens: Any,
    block_size: int,
    max_len: int,
    alibi_slopes: Any = None,
    *,
    partition_size: Optional[int] = None,
    tmp_dtype: str = "float32",
    **kw: Any,
) -> Optional[tuple[Any, Any, Any]]:
    """ops.paged_attention_v1 (version 1) or _v2 (version 2) into ``out`` over ``kv`` (its
    cache dtype and scales). v2's partition buffers are made here, NaN-poisoned, in the query's
    framework and device (tmp_out in ``tmp_dtype``) and returned as (exp_sums, max_logits,
    tmp_out); v1 returns None. ``kw``: the ops' keyword options (logits_soft_cap, ...)."""
    from pagedkv import ops

    args = (
        query,
        kv.key_cache,
        kv.value_cache,
        num_kv_heads,
        scale,
        kv.block_tables,
        seq_lens,
        block_size,
        max_len,
        alibi_slopes,
        kv.kv_cache_dtype,
        kv.k_scale,
        kv.v_scale,
    )
    if version == 1:
        ops.paged_attention_v1(out, *args, **kw)
        return None
    partition_size = partition_size or ops.PARTITION_SIZE
    fw = "numpy" if isinstance(query, np.ndarray) else "torch"
    device = "cpu" if fw == "numpy" else query.device
    n, h, d = query.shape
    parts = -(-max_len // partition_size)
    exp_sums = empty_like_fw((n, h, parts), fw, "float32", device)
    max_logits = empty_like_fw((n, h, parts), fw, "float32", device)
    tmp = empty_like_fw((n, h, parts, d), fw, tmp_dtype, device)
    ops.paged_attention_v2(
        out, exp_sums, max_logits, tmp, *args, partition_size=partition_size, **kw
    )
    return exp_sums, max_logits, tmp


def shared_prefix_tables(
    rng: Any, shared: int, lens: list[int], num_blocks: int, width: int, block_size: int
) -> np.ndarray:
    """Block tables ([rows, width] int32) of rows of ``lens`` keys sharing their first
    ``shared`` blocks (a cascade's common prefix), the rest their own: distinct random block
    ids out of ``num_blocks``."""
    perm = rng.permutation(num_blocks).astype(np.int32)
    tables = np.zeros((len(lens), width), np.int32)
    pos = shared
    for i, n in enumerate(lens):
        need = -(-n // block_size)
        tables[i, :shared] = perm[:shared]
        tables[i, shared:need] = perm[pos : pos + need - shared]
        pos += need - shared
    return tables
