"""The BM-128 tensor-core prefill kernel (the default for fp16/bf16) over many query and key tiles:
long, ragged sequences (several 128-row query tiles and 64-key tiles per sequence, cached prefix +
new tokens), GQA groups that split tokens across tiles, windows ending mid-tile, alibi / soft-cap,
and strided (padded) query / key / value / output rows that take the 16-byte and the scalar copy
paths. Outputs are NaN-poisoned (the padding around strided rows too, which must stay untouched)
and every element is compared with a float64 reference. The Hopper wgmma kernel (kernel="hopper")
runs the same cases where it applies, required so that a silent fallback fails."""

from __future__ import annotations

import itertools
import random

import pytest
from support.deps import need

torch = need("torch")

import pagedkv  # noqa: E402
from support.cuda_cases import TOL, make_paged_kv, rel_err  # noqa: E402
from test_ops_cuda import prefill_ref  # noqa: E402

pytestmark = pytest.mark.cuda
ops = pagedkv.ops
ROW_TOL = {torch.float16: 1e-2, torch.bfloat16: 6e-2}  # max |out - ref| over all elements
HEAD_SIZES = list(ops.SUPPORTED_HEAD_SIZES)


def _hopper() -> str:
    """The wgmma kernel's name, skipping off Hopper (compute 9.x). Naming it makes it required:
    a call it does not cover raises instead of silently taking another kernel."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma prefill kernel needs a compute capability 9.x GPU")
    return "hopper"


def _padded(
    shape: tuple[int, ...],
    pad: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    fill: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A [*, d] view of a [*, d + pad] tensor (row stride d + pad) and its backing tensor."""
    *lead, d = shape
    if fill is None:
        full = torch.randn(*lead, d + pad, generator=gen).to(dtype).cuda()
    else:
        full = torch.full((*lead, d + pad), fill, dtype=dtype, device="cuda")
    return full[..., :d], full


def _long_ragged_case(
    head_size: int,
    dtype: torch.dtype,
    layout: str,
    pads: list[int],
    kv_pads: list[int] | None = None,
    block_size: int | None = None,
    ctx_lens: list[int] | None = None,
    kv_dtype: str = "auto",
    kv_scales: tuple[float, float] | None = None,
    kernel: str = "tensor_core",
) -> None:
    """One random case: 1-3 sequences with or without a cached prefix, random GQA group, block
    size, options and row padding (query / output from `pads`, new keys / values from `kv_pads`,
    default the same), against the float64 reference. `block_size` / `ctx_lens` fix the block
    size / the cached prefixes (one sequence each) instead of drawing them; an fp8 `kv_dtype`
    quantises the cache with random scales, or `kv_scales` (the reference reads the dequantised
    values). `kernel` is the one the call must run on (ops.ATTENTION_KERNELS)."""
    r = random.Random()
    gen = torch.Generator().manual_seed(r.randrange(1 << 30))
    pad = r.choice(pads)  # 4: rows not 16-byte aligned -> the scalar copy paths
    kv_pad = pad if kv_pads is None else r.choice(kv_pads)
    hkv, group, bs = r.choice([1, 2]), r.choice([1, 3, 4, 8]), block_size or r.choice([16, 32])
    n = len(ctx_lens) if ctx_lens else r.randint(1, 3)
    ctx = ctx_lens or [r.choice([0, r.randint(1, 700)]) for _ in range(n)]
    qlen = [r.randint(1, 600) for _ in range(n)]
    qsl = [0, *itertools.accumulate(qlen)]
    hq, t = hkv * group, qsl[-1]
    q, _ = _padded((t, hq, head_size), pad, dtype, gen)
    k, _ = _padded((t, hkv, head_size), kv_pad, dtype, gen)
    v, _ = _padded((t, hkv, head_size), kv_pad, dtype, gen)
    out, out_full = _padded((t, hq, head_size), pad, dtype, gen, float("nan"))
    ks, vs = (1.0, 1.0) if kv_dtype == "auto" else (r.uniform(0.2, 2.0), r.uniform(0.2, 2.0))
    ks, vs = kv_scales or (ks, vs)
    kv = make_paged_kv(gen, ctx, hkv, head_size, bs, dtype, layout, kv_dtype, ks, vs)
    opts = {
        "alibi": (torch.rand(hq, generator=gen) * 0.1).cuda() if r.random() < 0.3 else None,
        "softcap": r.choice([0.0, 0.0, 20.0]),
        "window": r.choice([0, 0, r.randint(1, 100), r.randint(100, 900)]),
    }
    scale = head_size**-0.5
    ops.context_attention_fwd(
        q,
        k,
        v,
        out,
        kv_dtype,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        torch.tensor(qsl, dtype=torch.int32).cuda(),
        torch.tensor([c + x for c, x in zip(ctx, qlen)], dtype=torch.int32).cuda(),
        None,
        max(qlen),
        ks,
        vs,
        opts["alibi"],
        opts["window"] or None,
        scale,
        logits_soft_cap=opts["softcap"],
        kernel=kernel,
    )
    torch.cuda.synchronize()
    ref = prefill_ref(q, k, v, kv, qsl, ctx, scale, opts)
    case = (
        kv_dtype,
        pad,
        kv_pad,
        hkv,
        group,
        bs,
        ctx,
        qlen,
        opts["softcap"],
        opts["window"],
        opts["alibi"] is None,
    )
    assert rel_err(out, ref) < TOL[dtype], case
    assert (out.double().cpu() - ref).abs().max() < ROW_TOL[dtype], case
    if pad:
        assert out_full[..., head_size:].isnan().all(), "wrote outside the output rows"


@pytest.mark.parametrize("layout", ["nhd", "vllm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_prefill_mma_long_ragged(head_size, dtype, layout):
    _long_ragged_case(head_size, dtype, layout, [0, 8, 4])


# (head size, layout): fp8 in vLLM's key layout takes 16-element chunks, so 120 is NHD only.
# Every head size in NHD: the widening pass takes rows 32 / (head size / 8) at a time per warp
# (4 for 64, 3 for 80, 2 for 96 and 112, 1 for 192 and 256).
FP8_CASES = [
    (32, "nhd"),
    (64, "nhd"),
    (64, "vllm"),
    (80, "nhd"),
    (96, "nhd"),
    (112, "nhd"),
    (120, "nhd"),
    (128, "nhd"),
    (128, "vllm"),
    (192, "nhd"),
    (256, "nhd"),
    (256, "vllm"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize(("head_size", "layout"), FP8_CASES)
def test_prefill_mma_fp8_cache(head_size, layout, kv_dtype, dtype):
    """An fp8 cache: every sequence's cached context lands as fp8 bytes (cp.async of 8-byte runs:
    NHD rows, vLLM key chunks) and is widened in shared memory, or is loaded byte by byte into
    registers (vLLM's value layout); the new tokens come unquantised from k / v, so tiles that
    hold the context's end mix widened, fresh and zero rows."""
    r = random.Random()
    ctx = [r.randint(1, 700) for _ in range(r.randint(1, 3))]
    _long_ragged_case(head_size, dtype, layout, [0, 0, 4], ctx_lens=ctx, kv_dtype=kv_dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size", [64, 128])
def test_prefill_wgmma_long_ragged(head_size, dtype):
    """The same random cases on the wgmma kernel (NHD cache, 16-byte key / value rows: what it
    covers; query / output rows may take its scalar paths); a few per parametrisation, since each
    draws new options and shapes. Sequences without a cached prefix take the consumers'
    turn-taking, the others not."""
    kernel = _hopper()
    for _ in range(8):
        _long_ragged_case(head_size, dtype, "nhd", [0, 8, 4], kv_pads=[0, 8], kernel=kernel)


@pytest.mark.parametrize("block_size", [16, 32, 24, 64, 128])
def test_prefill_wgmma_cached_prefix_and_new_tokens(block_size):
    """Every sequence has a cached paged prefix and new tokens, so the producer's 16-key groups
    come from both TMA maps (cache: 16-slot boxes, and whole-block boxes for blocks of 32, 64 and
    128 that lie whole in a tile and in the context; 24 is not a multiple of 16 and takes cp.async
    for the cache) and from cp.async where a group holds the context's end (prefixes not
    multiples of 16); windows start tiles mid-block. The cache's unused slots are NaN, so a group
    read past the context shows."""
    kernel = _hopper()
    for head_size, dtype, ctx in [
        (128, torch.bfloat16, [37, 300, 16]),
        (64, torch.float16, [129, 5]),
        (128, torch.float16, [700]),
    ]:
        _long_ragged_case(
            head_size,
            dtype,
            "nhd",
            [0, 8],
            kv_pads=[0, 8],
            block_size=block_size,
            ctx_lens=ctx,
            kernel=kernel,
        )


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("head_size", [64, 128])
def test_prefill_wgmma_fp8_cache(head_size, kv_dtype):
    """The wgmma kernel with an fp8 cache (its own instantiation), required (a fallback fails).
    Whole cached groups land as raw bytes and are dequantised in place: by the consumers under
    the wgmma before the one that reads them (K and V for head size 64, V for 128) or by the
    producer a tile later (K for 128); the group holding the context's end passes through the
    producer's registers, and so does every cached group of blocks of 24 (no maps)."""
    kernel = _hopper()
    r = random.Random()
    for bs in (16, 32, 24):
        # Scales of 1 and 0.5 (exact in fp16 / bf16: the one-multiply path) and random ones.
        ctx = [r.randint(1, 700) for _ in range(r.randint(1, 3))]
        _long_ragged_case(
            head_size,
            r.choice([torch.float16, torch.bfloat16]),
            "nhd",
            [0, 8],
            kv_pads=[0, 8],
            block_size=bs,
            ctx_lens=ctx,
            kv_dtype=kv_dtype,
            kv_scales=(1.0, 0.5) if bs == 16 else None,
            kernel=kernel,
        )


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("head_size", [64, 128])
def test_prefill_wgmma_fp8_subnormals(head_size, kv_dtype):
    """Scales so large that most cached bytes are fp8 subnormals (|x| / scale below 2^-6 for
    e4m3, 2^-14 for e5m2): the wgmma producer's in-place dequantisation, which reads the bytes
    as 16-bit subnormals, must keep them (the reference reads them exactly)."""
    kernel = _hopper()
    big = 2.0**9 if kv_dtype == "fp8" else 2.0**14
    for bs in (16, 32):
        _long_ragged_case(
            head_size,
            random.choice([torch.float16, torch.bfloat16]),
            "nhd",
            [0],
            block_size=bs,
            ctx_lens=[random.randint(200, 700)],
            kv_dtype=kv_dtype,
            kv_scales=(big, big / 2),
            kernel=kernel,
        )


def test_prefill_wgmma_fallback():
    """A call the wgmma kernel does not cover (head size 96, vLLM value layout) takes the other
    kernels by default and raises when the wgmma kernel is named (on any GPU)."""
    _long_ragged_case(96, torch.float16, "nhd", [0], kernel="auto")
    _long_ragged_case(128, torch.bfloat16, "vllm", [0], kernel="auto")
    with pytest.raises(ValueError, match="kernel 'hopper' does not cover this call"):
        _long_ragged_case(96, torch.float16, "nhd", [0], kernel="hopper")


def _kernel(name: str) -> str:
    """The kernel argument of a parametrised test: the wgmma one skips off Hopper."""
    return _hopper() if name == "hopper" else name


@pytest.mark.parametrize("kernel", ["cuda_core", "tensor_core", "hopper"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_mma_pure_causal(dtype, kernel):
    """No cached prefix (the benchmark's shape, smaller): plain tiles below the diagonal."""
    kernel = _kernel(kernel)
    r = random.Random()
    gen = torch.Generator().manual_seed(r.randrange(1 << 30))
    b, length, hkv, group, d = 2, r.randint(900, 1300), 2, 4, 128
    n = b * length
    q = torch.randn(n, hkv * group, d, generator=gen).to(dtype).cuda()
    k = torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()
    out = torch.full_like(q, float("nan"))
    kv = make_paged_kv(gen, [0] * b, hkv, d, 16, dtype, "nhd")
    qsl = list(range(0, n + 1, length))
    ops.context_attention_fwd(
        q,
        k,
        v,
        out,
        "auto",
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        torch.tensor(qsl, dtype=torch.int32).cuda(),
        torch.full((b,), length, dtype=torch.int32).cuda(),
        None,
        length,
        kernel=kernel,
    )
    torch.cuda.synchronize()
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    ref = prefill_ref(q, k, v, kv, qsl, [0] * b, d**-0.5, opts)
    assert rel_err(out, ref) < TOL[dtype]
    assert (out.double().cpu() - ref).abs().max() < ROW_TOL[dtype]


@pytest.mark.parametrize("kernel", ["cuda_core", "tensor_core", "hopper"])
def test_prefill_next_sequence_does_not_leak(kernel):
    """The second sequence's keys and values are inf; the first sequence's outputs must not see
    them (its last tiles reach past its end, where causality gives P = 0, but 0 * inf is NaN):
    the copies of those rows must be zeros, not the next sequence's data."""
    kernel = _kernel(kernel)
    r = random.Random()
    gen = torch.Generator().manual_seed(r.randrange(1 << 30))
    hkv, group, d, dtype = 2, 4, 128, torch.bfloat16
    lens = [r.randint(130, 400), r.randint(50, 300)]  # the first not a multiple of the tiles
    n = sum(lens)
    q = torch.randn(n, hkv * group, d, generator=gen).to(dtype).cuda()
    k = torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()
    v = torch.randn(n, hkv, d, generator=gen).to(dtype).cuda()
    k[lens[0] :] = float("inf")
    v[lens[0] :] = float("inf")
    out = torch.full_like(q, float("nan"))
    kv = make_paged_kv(gen, [0, 0], hkv, d, 16, dtype, "nhd")
    qsl = [0, lens[0], n]
    ops.context_attention_fwd(
        q,
        k,
        v,
        out,
        "auto",
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        torch.tensor(qsl, dtype=torch.int32).cuda(),
        torch.tensor(lens, dtype=torch.int32).cuda(),
        None,
        max(lens),
        kernel=kernel,
    )
    torch.cuda.synchronize()
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    first = slice(0, lens[0])
    ref = prefill_ref(q[first], k[first], v[first], kv, qsl[:2], [0], d**-0.5, opts)
    assert out[first].isfinite().all(), lens
    assert rel_err(out[first], ref) < TOL[dtype], lens


@pytest.mark.parametrize("kernel", ["tensor_core", "hopper"])
def test_prefill_tile_order(kernel):
    """Every query tile is served exactly once in the CTAs' order (prefill_order.cuh: one
    (sequence, KV head) pair at a time, longest tile first): five ragged sequences (some with a
    cached prefix) x KV heads, where short sequences leave CTAs without a tile."""
    kernel = _kernel(kernel)
    for _ in range(2):
        _long_ragged_case(
            128,
            torch.bfloat16,
            "nhd",
            [0],
            block_size=16,
            ctx_lens=[0, 300, 0, 17, 0],
            kernel=kernel,
        )
