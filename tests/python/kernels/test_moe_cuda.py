"""The MoE CUDA kernels against float64 references over random shapes (0 tokens, one expert, K
and N off the tile sizes, every block size and dtype), against the CPU kernels on the same
inputs, and the whole FusedMoE pipeline under CUDA-graph capture."""

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

pytestmark = pytest.mark.cuda
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _np(x: torch.Tensor) -> np.ndarray:
    x = x.cpu()
    return x.double().numpy() if x.is_floating_point() else x.numpy()


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_softmax(dtype: torch.dtype, renormalize: bool) -> None:
    g = torch.Generator().manual_seed(1)
    for t, e, k in [(0, 4, 2), (1, 1, 1), (9, 8, 2), (300, 60, 4), (5, 128, 8), (3, 1024, 8)]:
        logits = (3 * torch.randn(t, e, generator=g)).to(dtype)
        w, ids = ops.topk_softmax(logits.cuda(), k, renormalize)
        want_w, want_ids = topk_softmax_ref(_np(logits), k, renormalize)
        assert (_np(ids) == want_ids).all()
        assert np.abs(_np(w) - want_w).max(initial=0) < 1e-6


@pytest.mark.parametrize("seed", range(30))
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
    sorted_ids, expert_ids, used = ops.moe_align_block_size(ids.cuda(), c["block"], e)
    check_alignment(
        ids.numpy(), e, c["block"], _np(sorted_ids), _np(expert_ids), int(used[0]), ordered=False
    )
    a = torch.randn(t, c["k"], generator=g).to(dtype)
    w = (torch.randn(e, c["n"], c["k"], generator=g) / c["k"] ** 0.5).to(dtype)
    weights = torch.rand(t, k, generator=g)
    for tw in (None, weights):
        out = ops.moe_grouped_gemm(
            a.cuda(),
            w.cuda(),
            sorted_ids,
            expert_ids,
            used,
            k,
            c["block"],
            None if tw is None else tw.cuda(),
        )
        want = grouped_gemm_ref(
            _np(a),
            _np(w),
            ids.reshape(-1).numpy().astype(np.int64),
            k,
            None if tw is None else tw.numpy(),
        )
        scale = max(1.0, np.abs(want).max(initial=0))
        assert np.abs(_np(out) - want).max(initial=0) <= TOL[str(dtype)[6:]] * scale


@pytest.mark.parametrize("kernel", ["pagedkv", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_experts_matches_cpu_and_captures(dtype: torch.dtype, kernel: str) -> None:
    """Both kernels (auto = torch._grouped_mm for bf16 on Hopper) against the CPU op, then
    captured in a CUDA graph and replayed with new routing."""
    g = torch.Generator().manual_seed(2)
    t, h, inter, e, k = 37, 256, 96, 8, 2
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g) / inter**0.5).to(dtype)
    logits = torch.randn(t, e, generator=g)
    weights, ids = ops.topk_softmax(logits, k, True)
    cpu = fused_experts(x, w13, w2, weights, ids)
    xc, w13c, w2c, lc = x.cuda(), w13.cuda(), w2.cuda(), logits.cuda()

    def run() -> torch.Tensor:
        wc, ic = ops.topk_softmax(lc, k, True)
        return fused_experts(xc, w13c, w2c, wc, ic, kernel=kernel)

    eager = run()
    tol = TOL[str(dtype)[6:]] * 4 * float(cpu.abs().max())
    assert float((eager.cpu().double() - cpu.double()).abs().max()) <= tol
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    lc.copy_(torch.randn(t, e, generator=g).cuda())  # new routing, same graph
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, run())


def test_block_size_refused_by_name() -> None:
    ids = torch.zeros(2, 1, dtype=torch.int32, device="cuda")
    s, ex, used = ops.moe_align_block_size(ids, 8, 2)
    with pytest.raises(ValueError, match="block_size = 8"):
        ops.moe_grouped_gemm(
            torch.ones(2, 8, device="cuda"), torch.ones(2, 4, 8, device="cuda"), s, ex, used, 1, 8
        )
