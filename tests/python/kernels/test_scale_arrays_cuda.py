"""fp8 scales as CUDA float32 tensors (what vLLM passes): every CUDA kernel reads them on the
device, against the float64 reference; a captured CUDA graph (no host synchronisation may
happen inside it) reads the value current at each replay; the cache writes quantise with them
exactly as with numbers."""

from __future__ import annotations

import random

import pytest
from support.deps import need

torch = need("torch")

import pagedkv  # noqa: E402
from support.cuda_cases import TOL, make_paged_kv, rel_err  # noqa: E402
from test_ops_cuda import decode_ref, prefill_ref, run_decode, run_prefill  # noqa: E402

pytestmark = pytest.mark.cuda
ops = pagedkv.ops
NO_OPTS = {"alibi": None, "softcap": 0.0, "window": 0}


def _kernel(name: str) -> str:
    if name == "hopper" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper kernels need a compute capability 9.x GPU")
    return name


def _scales(r: random.Random) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    ks, vs = r.uniform(0.2, 2.0), r.uniform(0.2, 2.0)
    return ks, vs, torch.tensor([ks], device="cuda"), torch.tensor(vs, device="cuda")


@pytest.mark.parametrize("kernel", ["hopper", "tensor_core", "cuda_core"])
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("partition", [0, 64])
def test_decode(kernel, kv_dtype, partition):
    kernel = _kernel(kernel)
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    ks, vs, ks_t, vs_t = _scales(r)
    lens, hkv, d = [300, 77], 2, 128
    kv = make_paged_kv(gen, lens, hkv, d, 16, torch.bfloat16, "nhd", kv_dtype, ks, vs)
    q = torch.randn(2, hkv * 4, d, generator=gen).to(torch.bfloat16).cuda()
    out = run_decode(
        q, kv, lens, hkv, d**-0.5, NO_OPTS, kv_dtype, ks_t, vs_t, partition, kernel=kernel
    )
    same = run_decode(
        q, kv, lens, hkv, d**-0.5, NO_OPTS, kv_dtype, ks, vs, partition, kernel=kernel
    )
    torch.cuda.synchronize()
    assert torch.equal(out, same), seed  # one code path: the value comes from memory
    assert rel_err(out, decode_ref(q, kv, lens, d**-0.5, NO_OPTS)) < TOL[torch.bfloat16], seed


@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("kernel", ["hopper", "tensor_core", "cuda_core"])
def test_prefill(kernel, head_size):
    """The wgmma kernel takes its register path for array scales (their range is not known on
    the host); the others read them like numbers."""
    kernel = _kernel(kernel)
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    ks, vs, ks_t, vs_t = _scales(r)
    ctx, qlen, hkv = [200, 33], [40, 100], 2
    qsl = [0, qlen[0], sum(qlen)]
    q = torch.randn(sum(qlen), hkv * 4, head_size, generator=gen).half().cuda()
    k = torch.randn(sum(qlen), hkv, head_size, generator=gen).half().cuda()
    v = torch.randn(sum(qlen), hkv, head_size, generator=gen).half().cuda()
    kv = make_paged_kv(gen, ctx, hkv, head_size, 16, torch.float16, "nhd", "fp8", ks, vs)
    sl = [c + x for c, x in zip(ctx, qlen)]
    out = run_prefill(
        q, k, v, kv, qsl, sl, head_size**-0.5, NO_OPTS, "fp8", ks_t, vs_t, kernel=kernel
    )
    torch.cuda.synchronize()
    ref = prefill_ref(q, k, v, kv, qsl, ctx, head_size**-0.5, NO_OPTS)
    assert rel_err(out, ref) < TOL[torch.float16], seed


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_cache_write(layout):
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    ks, vs, ks_t, vs_t = _scales(r)
    nb, bs, hkv, d, t = 6, 16, 2, 128, 50
    key = (torch.randn(t, hkv, d, generator=gen) * 3).half().cuda()
    value = (torch.randn(t, hkv, d, generator=gen) * 3).half().cuda()
    slots = torch.randperm(nb * bs, generator=gen)[:t].cuda()
    shapes = (
        ((nb, hkv, d // 16, bs, 16), (nb, hkv, d, bs))
        if layout == "vllm"
        else ((nb, bs, hkv, d), (nb, bs, hkv, d))
    )
    caches = [[torch.zeros(s, dtype=torch.uint8, device="cuda") for s in shapes] for _ in (0, 1)]
    pagedkv.PagedAttention.write_to_paged_cache(key, value, *caches[0], slots, "fp8", ks_t, vs_t)
    pagedkv.PagedAttention.write_to_paged_cache(key, value, *caches[1], slots, "fp8", ks, vs)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(*caches)), seed


def test_graph_replay_reads_the_current_scale():
    """A decode captured with scale tensors, replayed after the tensors change: the output is
    the eager one for the new values (a host read of the scale could not even be captured)."""
    kernel = "hopper" if torch.cuda.get_device_capability()[0] == 9 else "tensor_core"
    gen = torch.Generator().manual_seed(random.randrange(1 << 30))
    lens, hkv, d = [500, 130, 7], 2, 128
    kv = make_paged_kv(gen, lens, hkv, d, 16, torch.bfloat16, "nhd", "fp8", 0.5, 1.25)
    q = torch.randn(3, hkv * 4, d, generator=gen).to(torch.bfloat16).cuda()
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    ks_t, vs_t = torch.tensor([0.5], device="cuda"), torch.tensor([1.25], device="cuda")
    out = torch.empty_like(q)
    args = (
        q,
        kv.key_cache,
        kv.value_cache,
        hkv,
        d**-0.5,
        kv.block_tables,
        sl,
        16,
        max(lens),
        None,
        "fp8",
    )
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.paged_attention_v1(out, *args, ks_t, vs_t, kernel=kernel)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        ops.paged_attention_v1(out, *args, ks_t, vs_t, kernel=kernel)
    for k_scale, v_scale in [(0.5, 1.25), (0.25, 3.0), (1.75, 0.5)]:
        ks_t.fill_(k_scale)
        vs_t.fill_(v_scale)
        out.fill_(float("nan"))
        graph.replay()
        want = torch.empty_like(q)
        ops.paged_attention_v1(want, *args, k_scale, v_scale, kernel=kernel)
        torch.cuda.synchronize()
        assert torch.equal(out, want), (k_scale, v_scale)


def test_cuda_scale_must_be_float32():
    q = torch.zeros(1, 4, 64, dtype=torch.float16, device="cuda")
    kc = torch.zeros(2, 16, 2, 64, dtype=torch.uint8, device="cuda")
    out = torch.empty_like(q)
    args = (
        out,
        q,
        kc,
        kc,
        2,
        0.125,
        torch.zeros(1, 2, dtype=torch.int32, device="cuda"),
        torch.tensor([3], dtype=torch.int32, device="cuda"),
        16,
        3,
        None,
        "fp8",
    )
    with pytest.raises(TypeError, match="k_scale on the GPU must be float32"):
        ops.paged_attention_v1(*args, torch.ones(1, dtype=torch.float64, device="cuda"), 1.0)
    with pytest.raises(ValueError, match="v_scale is on cpu"):
        ops.paged_attention_v1(*args, 1.0, torch.ones(1))
