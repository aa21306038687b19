"""The MoE ops on the CPU against float64 references over random shapes (0 tokens, one expert,
K and N off the tile sizes), the whole FusedMoE pipeline against a dense per-token loop, and
argument errors that name the argument."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.deps import need
from support.moe_reference import (
    TOL,
    check_alignment,
    grouped_gemm_ref,
    random_case,
    topk_softmax_ref,
)

torch = need("torch")

from pagedkv import ops  # noqa: E402
from pagedkv.models.moe import fused_experts  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _np(x: torch.Tensor) -> np.ndarray:
    return x.double().numpy() if x.is_floating_point() else x.numpy()


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_softmax(dtype: torch.dtype, renormalize: bool) -> None:
    g = torch.Generator().manual_seed(1)
    for t, e, k in [(0, 4, 2), (1, 1, 1), (9, 8, 2), (40, 60, 4), (5, 128, 8)]:
        logits = (3 * torch.randn(t, e, generator=g)).to(dtype)
        w, ids = ops.topk_softmax(logits, k, renormalize)
        want_w, want_ids = topk_softmax_ref(_np(logits), k, renormalize)
        assert w.dtype == torch.float32 and ids.dtype == torch.int32
        assert (ids.numpy() == want_ids).all()
        assert np.abs(w.numpy() - want_w).max(initial=0) < 1e-6


def test_topk_softmax_strided_rows_and_ties() -> None:
    logits = torch.zeros(3, 10)[:, :5]  # every expert tied; rows of stride 10
    w, ids = ops.topk_softmax(logits, 2, False)
    assert (ids == torch.tensor([0, 1], dtype=torch.int32)).all()
    assert torch.allclose(w, torch.full((3, 2), 0.2))


@pytest.mark.parametrize("seed", range(12))
def test_align_and_grouped_gemm(seed: int) -> None:
    rng = random.Random(seed)
    c = random_case(rng)
    dtype = DTYPES[seed % 3]
    g = torch.Generator().manual_seed(seed)
    t, e, k = c["tokens"], c["experts"], c["top_k"]
    ids = (
        torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
        if t
        else torch.zeros(0, k, dtype=torch.int32)
    )
    sorted_ids, expert_ids, used = ops.moe_align_block_size(ids, c["block"], e)
    check_alignment(
        ids.numpy(),
        e,
        c["block"],
        sorted_ids.numpy(),
        expert_ids.numpy(),
        int(used[0]),
        ordered=True,
    )

    a = torch.randn(t, c["k"], generator=g).to(dtype)
    w = (torch.randn(e, c["n"], c["k"], generator=g) / c["k"] ** 0.5).to(dtype)
    weights = torch.rand(t, k, generator=g)
    for top_k, rows, tw in [(k, a, None), (k, a, weights)]:
        out = ops.moe_grouped_gemm(rows, w, sorted_ids, expert_ids, used, top_k, c["block"], tw)
        want = grouped_gemm_ref(
            _np(rows),
            _np(w),
            ids.reshape(-1).numpy().astype(np.int64),
            top_k,
            None if tw is None else tw.numpy(),
        )
        assert out.shape == (t * k, c["n"]) and out.dtype == dtype
        scale = max(1.0, np.abs(want).max(initial=0))
        assert np.abs(_np(out) - want).max(initial=0) <= TOL[str(dtype)[6:]] * scale


def test_second_projection_reads_pair_rows() -> None:
    """top_k = 1 over [T*k, K] rows: the down projection of each (token, expert) pair."""
    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([[2, 0], [1, 2], [2, 1]], dtype=torch.int32)
    sorted_ids, expert_ids, used = ops.moe_align_block_size(ids, 16, 3)
    h = torch.randn(6, 20, generator=g, dtype=torch.float64).float()
    w = torch.randn(3, 12, 20, generator=g)
    out = ops.moe_grouped_gemm(h, w, sorted_ids, expert_ids, used, 1, 16)
    want = torch.stack([h[i] @ w[ids.reshape(-1)[i]].T for i in range(6)])
    assert torch.allclose(out, want, atol=1e-5)


def test_negative_expert_block_writes_zeros() -> None:
    ids = torch.tensor([[0], [1]], dtype=torch.int32)
    sorted_ids, expert_ids, used = ops.moe_align_block_size(ids, 16, 2)
    expert_ids[1] = -1  # expert 1 lives on another rank
    out = ops.moe_grouped_gemm(
        torch.ones(2, 8), torch.ones(2, 4, 8), sorted_ids, expert_ids, used, 1, 16
    )
    assert (out[0] == 8).all() and (out[1] == 0).all()


@pytest.mark.parametrize("kernel", ["pagedkv", "grouped_mm"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_fused_experts_matches_dense_loop(renormalize: bool, kernel: str) -> None:
    if kernel == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    g = torch.Generator().manual_seed(4)
    t, h, inter, e, k = 11, 32, 24, 6, 2
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, 2 * inter, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, inter, generator=g) / inter**0.5
    logits = torch.randn(t, e, generator=g)
    weights, ids = ops.topk_softmax(logits, k, renormalize)
    out = fused_experts(x, w13, w2, weights, ids, kernel=kernel)
    want = torch.zeros(t, h, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            ex = int(ids[i, j])
            gu = w13[ex].double() @ x[i].double()
            act = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            want[i] += float(weights[i, j]) * (w2[ex].double() @ act)
    assert torch.allclose(out.double(), want, atol=1e-5)


def test_errors_name_the_argument() -> None:
    ids = torch.tensor([[0, 5]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_ids\[0, 1\] = 5"):
        ops.moe_align_block_size(ids, 16, 4)
    with pytest.raises(ValueError, match="top_k"):
        ops.topk_softmax(torch.zeros(2, 3), 4, True)
    with pytest.raises(TypeError, match="gating_output"):
        ops.topk_softmax(torch.zeros(2, 3, dtype=torch.int32), 1, True)
    ids = torch.tensor([[0], [1]], dtype=torch.int32)
    s, ex, used = ops.moe_align_block_size(ids, 16, 2)
    with pytest.raises(TypeError, match="w"):
        ops.moe_grouped_gemm(
            torch.ones(2, 8), torch.ones(2, 4, 8, dtype=torch.float16), s, ex, used, 1, 16
        )
    with pytest.raises(ValueError, match="expert_ids"):
        ops.moe_grouped_gemm(torch.ones(2, 8), torch.ones(1, 4, 8), s, ex, used, 1, 16)
    with pytest.raises(ValueError, match="out has 3 rows"):
        ops.moe_grouped_gemm(
            torch.ones(2, 8), torch.ones(2, 4, 8), s, ex, used, 1, 16, out=torch.empty(3, 4)
        )
    with pytest.raises(ValueError, match="sorted_token_ids"):
        ops.moe_grouped_gemm(
            torch.ones(2, 8),
            torch.ones(2, 4, 8),
            s,
            ex,
            used,
            1,
            16,
            out=s.view(torch.float32)[:8].view(2, 4),
        )  # shares its memory
