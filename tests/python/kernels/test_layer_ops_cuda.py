"""The fused layer ops' CUDA kernels against float64 references (fresh random shapes, strided
views, every dtype, packed and unpacked paths), bitwise against the CPU kernels where the math
is elementwise, and captured in a CUDA graph."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

from pagedkv import ops  # noqa: E402
from support.layer_reference import (  # noqa: E402
    DTYPES,
    check_act_and_mul,
    check_rms_norm,
    check_rotary,
    cos_sin_cache,
)

pytestmark = pytest.mark.cuda

TRIALS = range(8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("trial", TRIALS)
def test_rms_norm_cuda_matches_float64(dtype, fused, trial):
    check_rms_norm("cuda", dtype, fused)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trial", TRIALS)
def test_rotary_cuda_matches_float64(dtype, trial):
    check_rotary("cuda", dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("trial", range(4))
def test_act_and_mul_cuda_matches_float64(dtype, name, trial):
    check_act_and_mul("cuda", dtype, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rotary_cuda_is_the_cpu_kernel_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 6, 128, generator=g).to(dtype)
    cache = cos_sin_cache(512, 128, 10000.0, torch.float32, "cpu")
    pos = torch.randint(0, 512, (33,), generator=g)
    cpu, gpu = x.clone(), x.cuda()
    ops.rotary_embedding(pos, cpu, None, 128, cache)
    ops.rotary_embedding(pos.cuda(), gpu, None, 128, cache.cuda())
    assert torch.equal(gpu.cpu(), cpu)


def test_rotary_cuda_leaves_out_of_range_positions_unrotated():
    x = torch.randn(2, 1, 8, device="cuda")
    before = x.clone()
    ops.rotary_embedding(
        torch.tensor([1, 99], device="cuda"),
        x,
        None,
        8,
        cos_sin_cache(4, 8, 10000.0, torch.float32, "cuda"),
    )
    assert not torch.equal(x[0], before[0]) and torch.equal(x[1], before[1])


def test_layer_ops_in_a_cuda_graph():
    """A decoder block's elementwise chain captured once and replayed on new inputs."""
    dtype, t, h, d = torch.bfloat16, 16, 4, 64
    x = torch.empty(t, h * d, dtype=dtype, device="cuda")
    res = torch.empty_like(x)
    gu = torch.empty(t, 2 * 256, dtype=dtype, device="cuda")
    act = torch.empty(t, 256, dtype=dtype, device="cuda")
    w = torch.rand(h * d, dtype=dtype, device="cuda")
    pos = torch.empty(t, dtype=torch.long, device="cuda")
    cache = cos_sin_cache(128, d, 10000.0, dtype, "cuda")

    def step() -> None:
        ops.fused_add_rms_norm(x, res, w, 1e-6)
        ops.rotary_embedding(pos, x.view(t, h, d), None, d, cache)
        ops.silu_and_mul(act, gu)

    def fill(seed: int) -> list[torch.Tensor]:
        g = torch.Generator(device="cuda").manual_seed(seed)
        for a in (x, res, gu):
            a.copy_(torch.randn(a.shape, generator=g, device="cuda").to(dtype))
        pos.copy_(torch.randint(0, 128, (t,), generator=g, device="cuda"))
        step()  # eager result for these inputs
        out = [x.clone(), res.clone(), act.clone()]
        g = torch.Generator(device="cuda").manual_seed(seed)
        for a in (x, res, gu):
            a.copy_(torch.randn(a.shape, generator=g, device="cuda").to(dtype))
        return out

    fill(0)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    for seed in (1, 2):
        want = fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        for got, ref in zip((x, res, act), want):
            assert torch.equal(got, ref)
