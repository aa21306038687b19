"""The MoE ops' float64 references and random cases, shared by the CPU (tests/python/ops) and
CUDA (tests/python/kernels) tests of pagedkv.ops.topk_softmax / moe_align_block_size /
moe_grouped_gemm."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

# Relative tolerance (of the output's largest magnitude) per input dtype: fp32 accumulation
# over K <= 512 products of inputs rounded to the dtype.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


def topk_softmax_ref(logits: np.ndarray, k: int, renormalize: bool
                     ) -> tuple[np.ndarray, np.ndarray]:
    """float64 softmax over the experts, top-k (largest first, ties to the lower id)."""
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, -1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    return w, ids


def check_alignment(topk_ids: np.ndarray, num_experts: int, block_size: int,
                    sorted_ids: np.ndarray, expert_ids: np.ndarray, used: int,
                    ordered: bool) -> None:
    """The contract of moe_align_block_size: each pair once, each block of one expert (its
    expert_ids entry), groups padded with T*k to multiples of block_size, in expert order;
    ``ordered``: pairs in increasing order within an expert (the CPU kernel)."""
    pairs = topk_ids.size
    flat = topk_ids.reshape(-1)
    counts = np.bincount(flat, minlength=num_experts)
    padded = -(-counts // block_size) * block_size
    assert used == padded.sum()
    assert (sorted_ids[used:] == pairs).all() and (expert_ids[used // block_size:] == -1).all()
    start = 0
    for e in range(num_experts):
        group = sorted_ids[start:start + padded[e]]
        assert (expert_ids[start // block_size:(start + padded[e]) // block_size] == e).all()
        real = group[group < pairs]
        assert len(real) == counts[e] and (group[counts[e]:] == pairs).all()
        want = np.flatnonzero(flat == e)
        assert (real == want).all() if ordered else (np.sort(real) == want).all()
        start += padded[e]


def grouped_gemm_ref(a: np.ndarray, w: np.ndarray, pair_experts: np.ndarray, top_k: int,
                     weights: np.ndarray | None) -> np.ndarray:
    """out[i] = a[i // top_k] @ w[pair_experts[i]].T (* weights[i]) in float64."""
    rows = a.astype(np.float64)[np.arange(len(pair_experts)) // top_k]
    out = np.einsum("ik,ink->in", rows, w.astype(np.float64)[pair_experts])
    return out if weights is None else out * weights.reshape(-1, 1).astype(np.float64)


def random_case(rng: random.Random) -> dict[str, Any]:
    """Shapes of one grouped-GEMM case: tokens (0 included), experts, top_k, N, K, block."""
    e = rng.choice([1, 3, 8, 16, 60])
    return dict(tokens=rng.choice([0, 1, 2, 7, 33, 130]), experts=e,
                top_k=rng.randint(1, min(e, 4)), n=rng.choice([1, 8, 40, 96, 200]),
                k=rng.choice([8, 24, 64, 200, 512]), block=rng.choice([16, 32, 64]))
