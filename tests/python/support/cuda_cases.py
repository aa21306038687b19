"""Random paged KV caches and a float64 attention reference for the CUDA op tests.

Caches are made in a logical NHD form ``[num_blocks, block_size, num_kv_heads, head_size]`` and
converted to either layout; fp8 caches are quantised with torch's own float8 types, and the
reference reads the dequantised values, so the kernels' arithmetic is what is checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1.5e-2}


def to_layout(logical: torch.Tensor, layout: str, is_value: bool) -> torch.Tensor:
    """NHD [nb, bs, h, d] -> the requested layout (vLLM keys [nb, h, d/x, bs, x], values
    [nb, h, d, bs]); x = 16 // element size."""
    if layout == "nhd":
        return logical.contiguous()
    nb, bs, h, d = logical.shape
    if is_value:
        return logical.permute(0, 2, 3, 1).contiguous()
    x = 16 // logical.element_size()
    return logical.reshape(nb, bs, h, d // x, x).permute(0, 2, 3, 1, 4).contiguous()


def from_layout(cache: torch.Tensor, layout: str, is_value: bool) -> torch.Tensor:
    """Inverse of to_layout: back to NHD [nb, bs, h, d]."""
    if layout == "nhd":
        return cache
    if is_value:
        return cache.permute(0, 3, 1, 2)
    nb, h, dx, bs, x = cache.shape
    return cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, h, dx * x)


def quantize(x: torch.Tensor, kv_dtype: str, scale: float) -> torch.Tensor:
    """float -> uint8 fp8 storage (stored = x / scale), like the cache writes."""
    return (x.float() / scale).to(FP8[kv_dtype]).view(torch.uint8)


def dequantize(x: torch.Tensor, kv_dtype: str, scale: float) -> torch.Tensor:
    return x.view(FP8[kv_dtype]).double() * scale


@dataclass
class PagedKV:
    key_cache: torch.Tensor  # on the GPU (or make_paged_kv's device), in `layout`
    value_cache: torch.Tensor
    k_logical: torch.Tensor  # float64 NHD, dequantised, on the CPU
    v_logical: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, with the caches
    block_size: int


def make_paged_kv(
    gen: torch.Generator,
    seq_lens: list[int],
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    layout: str,
    kv_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    extra_blocks: int = 3,
    device: str = "cuda",
) -> PagedKV:
    """A cache holding each sequence's tokens in randomly permuted blocks (unused blocks and
    slots are filled with garbage: large values and NaN, which the kernels must never read), its
    caches and block tables on `device`."""
    need = [max(1, math.ceil(n / block_size)) for n in seq_lens]
    nb = sum(need) + extra_blocks
    shape = (nb, block_size, num_kv_heads, head_size)
    k = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)
    perm = torch.randperm(nb, generator=gen)
    max_blocks = max(need) + 2
    tables = torch.zeros((len(seq_lens), max_blocks), dtype=torch.int32)
    used = torch.zeros(shape[:2], dtype=torch.bool)
    pos = 0
    for i, n in enumerate(seq_lens):
        blocks = perm[pos : pos + need[i]]
        pos += need[i]
        tables[i, : need[i]] = blocks.int()
        for j, b in enumerate(blocks.tolist()):
            used[b, : max(0, min(block_size, n - j * block_size))] = True
    if kv_dtype == "auto":
        kq, vq = k.to(dtype), v.to(dtype)
        k_ref, v_ref = kq.double(), vq.double()
        for t in (kq, vq):
            t[~used] = float("nan")  # stale slots: NaN must never reach an output
    else:
        kq, vq = quantize(k, kv_dtype, k_scale), quantize(v, kv_dtype, v_scale)
        k_ref, v_ref = dequantize(kq, kv_dtype, k_scale), dequantize(vq, kv_dtype, v_scale)
        nan = 0x7F if kv_dtype != "fp8_e5m2" else 0x7E
        for t in (kq, vq):
            t[~used] = nan
    return PagedKV(
        to_layout(kq, layout, False).to(device),
        to_layout(vq, layout, True).to(device),
        k_ref,
        v_ref,
        tables.to(device),
        block_size,
    )


def gather(kv: PagedKV, seq: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n cached tokens of sequence `seq` as float64 [n, h, d]."""
    table = kv.block_tables[seq].cpu().long()
    idx = torch.arange(n)
    blocks = table[idx // kv.block_size]
    slots = idx % kv.block_size
    return kv.k_logical[blocks, slots], kv.v_logical[blocks, slots]


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    alibi: Optional[torch.Tensor] = None,
    softcap: float = 0.0,
    window: int = 0,
) -> torch.Tensor:
    """float64 attention of queries q [nq, hq, d] at positions q_pos [nq] to keys/values
    [nk, hkv, d] at positions 0..nk-1: causal, optional alibi / soft-cap / sliding window."""
    q, k, v = q.double(), k.double(), v.double()
    hq, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * scale
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    kpos = torch.arange(k.shape[0], dtype=torch.float64)
    rel = kpos[None, :] - q_pos.double()[:, None]  # [nq, nk]
    if alibi is not None:
        logits = logits + alibi.double().cpu()[:, None, None] * rel[None]
    mask = rel > 0
    if window > 0:
        mask |= rel <= -window
    logits = logits.masked_fill(mask[None], float("-inf"))
    p = torch.softmax(logits, dim=-1)
    # Fully masked rows -> 0; a NaN elsewhere (a NaN or infinite cached value) stays NaN.
    p = p.masked_fill(mask.all(-1)[None, :, None], 0.0)
    return torch.einsum("hqk,khd->qhd", p, v)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    assert torch.isfinite(out).all(), "non-finite values in the output (unwritten or NaN)"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))
