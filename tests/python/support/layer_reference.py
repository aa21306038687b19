"""float64 references of the fused layer ops (pagedkv.layer_ops) and the random cases their CPU
and CUDA tests share."""

from __future__ import annotations

import math
import random
from typing import Optional

import torch

# Largest error allowed, relative to the reference's largest magnitude: the ops round like the
# eager fp16 / bf16 formulas (a few ulps of the dtype), fp32 only in the last bits.
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    scale = float(ref.abs().max()) if ref.numel() else 1.0
    return (
        float((out.double().cpu() - ref.cpu()).abs().max()) / max(scale, 1e-30)
        if ref.numel()
        else 0.0
    )


def rms_norm_ref(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float) -> torch.Tensor:
    xd = x.double()
    inv = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    return xd * inv * (offset + w.double())


def rotary_ref(
    positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """x [T, H, D] rotated by cache[positions] ([max_pos, rot]: cos | sin) in float64."""
    xd = x.double().clone()
    rot = cache.shape[1]
    half = rot // 2
    cs = cache.double()[positions.long()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    if is_neox:
        x1, x2 = xd[..., :half], xd[..., half:rot]
    else:
        x1, x2 = xd[..., 0:rot:2], xd[..., 1:rot:2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if is_neox:
        xd[..., :half], xd[..., half:rot] = o1, o2
    else:
        xd[..., 0:rot:2], xd[..., 1:rot:2] = o1, o2
    return xd


def act_ref(name: str, x: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    d = xd.shape[-1] // 2
    g, u = xd[..., :d], xd[..., d:]
    if name == "silu":
        a = g * torch.sigmoid(g)
    elif name == "gelu":
        a = 0.5 * g * (1 + torch.erf(g / math.sqrt(2)))
    else:
        a = 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
    return a * u


def strided_rows(
    r: random.Random, shape: tuple[int, ...], dtype: torch.dtype, device: str, gen: torch.Generator
) -> torch.Tensor:
    """A random array of `shape` that is, by a coin flip, a strided view (padding in the last
    dimension of a wider buffer, as a slice of a fused projection is)."""
    pad = r.choice([0, 0, 3, 8])
    full = torch.randn(*shape[:-1], shape[-1] + pad, generator=gen, dtype=torch.float32)
    full = (full * r.choice([0.5, 1.0, 4.0])).to(dtype).to(device)
    return full[..., pad:] if pad and r.random() < 0.5 else full[..., : shape[-1]]


def cos_sin_cache(
    max_pos: int, rot: int, base: float, dtype: torch.dtype, device: str
) -> torch.Tensor:
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=1).to(dtype).to(device)


def random_case_rng(seed: Optional[int] = None) -> tuple[random.Random, torch.Generator, int]:
    seed = random.randrange(1 << 30) if seed is None else seed
    return random.Random(seed), torch.Generator().manual_seed(seed), seed


# ---- one random case per op, run on `device` (the CPU and CUDA tests share them) -------------


def _shape(r: random.Random, width: int) -> tuple[int, ...]:
    rank = r.choice([1, 2, 2, 3])
    lead = [r.choice([1, 2, 5, 17]) for _ in range(rank - 1)]
    return (*lead, width)


def check_rms_norm(
    device: str, dtype: torch.dtype, fused: bool, seed: Optional[int] = None
) -> None:
    from pagedkv import ops

    r, g, seed = random_case_rng(seed)
    width = r.choice([8, 37, 64, 256, 1000, 2048])
    shape = _shape(r, width)
    x = strided_rows(r, shape, dtype, device, g)
    w = (torch.randn(width, generator=g) * 0.5 + 1).to(dtype).to(device)
    eps, offset = r.choice([1e-6, 1e-5, 0.1]), r.choice([0.0, 0.0, 1.0])
    if fused:
        res = strided_rows(r, shape, dtype, device, g)
        total = x.double() + res.double()
        ops.fused_add_rms_norm(x, res, w, eps, weight_offset=offset)
        assert rel_err(res, total) <= TOL[dtype], seed
        ref, out = rms_norm_ref(total, w, eps, offset), x
    else:
        out = torch.full_like(x, float("nan"))
        ops.rms_norm(out, x, w, eps, weight_offset=offset)
        ref = rms_norm_ref(x, w, eps, offset)
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"seed {seed}: shape {shape} offset {offset}: error {err}"


def check_rotary(device: str, dtype: torch.dtype, seed: Optional[int] = None) -> None:
    from pagedkv import ops

    r, g, seed = random_case_rng(seed)
    head = r.choice([32, 64, 80, 128])
    rot = r.choice([head, head, head // 2, 16])
    tokens, hq, hk = r.choice([1, 3, 40]), r.choice([1, 4, 8]), r.choice([1, 2])
    max_pos = r.choice([64, 4096])
    cache_dtype = r.choice([torch.float32, dtype])
    cache = cos_sin_cache(max_pos, rot, r.choice([10000.0, 500000.0]), cache_dtype, device)
    # q and k as views of one fused projection, like a model's qkv output.
    qkv = (torch.randn(tokens, (hq + 2 * hk) * head, generator=g) * 2).to(dtype).to(device)
    q = qkv[:, : hq * head].view(tokens, hq, head)
    k = qkv[:, hq * head : (hq + hk) * head].view(tokens, hk, head)
    v_before = qkv[:, (hq + hk) * head :].clone()
    positions = torch.randint(0, max_pos, (tokens,), generator=g).to(device)
    is_neox = r.random() < 0.7
    q_ref = rotary_ref(positions.cpu(), q.cpu(), cache.cpu(), is_neox)
    k_ref = rotary_ref(positions.cpu(), k.cpu(), cache.cpu(), is_neox)
    with_key = r.random() < 0.8
    ops.rotary_embedding(positions, q, k if with_key else None, head, cache, is_neox)
    where = f"seed {seed}: T={tokens} heads {hq}/{hk} head {head} rot {rot} neox {is_neox}"
    assert rel_err(q, q_ref) <= TOL[dtype], where
    if with_key:
        assert rel_err(k, k_ref) <= TOL[dtype], where
    else:
        assert torch.equal(
            k.cpu(), qkv[:, hq * head : (hq + hk) * head].view(tokens, hk, head).cpu()
        ), where
    assert torch.equal(qkv[:, (hq + hk) * head :], v_before), f"{where}: v was touched"


def check_act_and_mul(
    device: str, dtype: torch.dtype, name: str, seed: Optional[int] = None
) -> None:
    from pagedkv import ops

    r, g, seed = random_case_rng(seed)
    d = r.choice([8, 13, 64, 344, 2048])
    x = strided_rows(r, _shape(r, 2 * d), dtype, device, g)
    out = torch.full((*x.shape[:-1], d), float("nan"), dtype=dtype, device=device)
    getattr(ops, f"{name}_and_mul")(out, x)
    err = rel_err(out, act_ref(name, x))
    assert err <= TOL[dtype], f"seed {seed}: {name} shape {tuple(x.shape)} error {err}"
