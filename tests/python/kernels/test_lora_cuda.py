"""The multi-LoRA CUDA kernels against float64 references (tokens without an adapter, several
slices, shapes off the block sizes, every dtype) and under CUDA-graph capture, where the indices
change between replays without a host synchronisation."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.lora_reference import TOL, expand_ref, random_indices, shrink_ref

torch = need("torch")

from pagedkv import ops  # noqa: E402

pytestmark = pytest.mark.cuda
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _np(x: torch.Tensor) -> np.ndarray:
    return x.cpu().double().numpy()


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 7, 1, [3]),
        (37, 3, 300, 16, [300, 100, 100]),
        (256, 8, 2048, 16, [2048]),
        (70, 2, 64, 160, [40, 30, 30]),  # wide shrunk rows: tiled expand of 25 tokens
        (45, 1, 96, 8, [64, 32]),  # one adapter: runs of tokens share A pieces (tiled shrink)
    ],
)
def test_shrink_then_expand(dtype: torch.dtype, shape: tuple, tiled: bool) -> None:
    t, loras, k, r, sizes = shape
    g = torch.Generator().manual_seed(t + k)
    n, s = sum(sizes), len(sizes)
    x = torch.randn(t, k, generator=g).to(dtype).cuda()
    a = (torch.randn(loras, s * r, k, generator=g) / k**0.5).to(dtype).cuda()
    b = torch.randn(loras, n, r, generator=g).to(dtype).cuda()
    idx = random_indices(torch, t, loras, g).cuda()
    tol = TOL[str(dtype).rsplit(".", 1)[-1]]
    buf = ops.lora_shrink(x, a, idx, tiled=tiled)
    want = shrink_ref(_np(x), _np(a), idx.cpu().numpy())
    np.testing.assert_allclose(_np(buf), want, rtol=tol, atol=tol)
    y = torch.randn(t, n, generator=g).to(dtype).cuda()
    y0 = y.clone()
    ops.lora_expand(y, buf, b, idx, sizes, tiled=tiled)
    want_y = expand_ref(_np(y0), _np(buf), _np(b), idx.cpu().numpy(), sizes)
    np.testing.assert_allclose(_np(y), want_y, rtol=tol, atol=tol * r**0.5)
    cpu_y = y0.cpu()
    ops.lora_expand(cpu_y, buf.cpu(), b.cpu(), idx.cpu(), sizes)
    np.testing.assert_allclose(_np(y), _np(cpu_y), rtol=tol, atol=tol * r**0.5)


@pytest.mark.parametrize("tiled", [False, True])
def test_graph_replay_reads_new_indices(tiled: bool) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 64, generator=g).cuda()
    a = torch.randn(3, 8, 64, generator=g).cuda()
    b = torch.randn(3, 32, 8, generator=g).cuda()
    idx = torch.zeros(16, dtype=torch.int32, device="cuda")
    y = torch.zeros(16, 32, device="cuda")
    buf = torch.empty(16, 8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.lora_shrink(x, a, idx, out=buf, tiled=tiled)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        y.zero_()
        ops.lora_shrink(x, a, idx, out=buf, tiled=tiled)
        ops.lora_expand(y, buf, b, idx, tiled=tiled)
    new = random_indices(torch, 16, 3, g)
    idx.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    want = expand_ref(
        np.zeros((16, 32)), shrink_ref(_np(x), _np(a), new.numpy()), _np(b), new.numpy(), [32]
    )
    np.testing.assert_allclose(_np(y), want, rtol=1e-4, atol=1e-4)
