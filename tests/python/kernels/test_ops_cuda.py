"""CUDA kernels against a float64 reference: cache writes, decode (v1 and split-K v2), prefill
over a paged prefix, block copies and swaps. Every case draws fresh random shapes and data;
outputs are NaN-poisoned before each call and every element is checked."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from support.deps import need

torch = need("torch")

import pagedkv  # noqa: E402
from support.cuda_cases import (  # noqa: E402
    TOL,
    attention_ref,
    dequantize,
    from_layout,
    gather,
    make_paged_kv,
    quantize,
    rel_err,
    to_layout,
)

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LAYOUTS = ["vllm", "nhd"]


ops = pagedkv.ops
HEAD_SIZES = list(ops.SUPPORTED_HEAD_SIZES)


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _rng(*key: object) -> tuple[random.Random, torch.Generator]:
    seed = random.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    return random.Random(seed), gen


def _options(r: random.Random, num_heads: int, prefill: bool) -> dict:
    alibi = (
        (
            torch.rand(num_heads, generator=torch.Generator().manual_seed(r.randrange(1 << 30)))
            * 0.2
        ).cuda()
        if r.random() < 0.3
        else None
    )
    return {
        "alibi": alibi,
        "softcap": r.choice([0.0, 0.0, 30.0, 5.0]),
        "window": r.choice([0, 0, 0, r.randint(1, 300)]),
    }


def run_decode(
    q,
    kv,
    seq_lens,
    hkv,
    scale,
    opts,
    kv_dtype,
    ks,
    vs,
    partition_size,
    device="cuda",
    kernel="auto",
):
    """Decode through v1 (partition_size 0) or v2 on `device` (on `kernel`, required unless
    "auto"); returns the output."""
    mv = (lambda x: x.to(device)) if device == "cpu" else (lambda x: x)
    q = mv(q)
    out = torch.full_like(q, float("nan"))
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    max_len = max(seq_lens)
    args = (
        q,
        mv(kv.key_cache),
        mv(kv.value_cache),
        hkv,
        scale,
        mv(kv.block_tables),
        sl,
        kv.block_size,
        max_len,
        None if opts["alibi"] is None else mv(opts["alibi"]),
        kv_dtype,
        ks,
        vs,
    )
    kw = {
        "logits_soft_cap": opts["softcap"],
        "sliding_window": opts["window"] or None,
        "kernel": kernel,
    }
    if partition_size:
        parts = math.ceil(max_len / partition_size)
        n, h, d = q.shape
        es = torch.full((n, h, parts), float("nan"), device=device)
        ml = torch.full((n, h, parts), float("nan"), device=device)
        tmp = torch.full((n, h, parts, d), float("nan"), device=device)
        ops.paged_attention_v2(out, es, ml, tmp, *args, partition_size=partition_size, **kw)
    else:
        ops.paged_attention_v1(out, *args, **kw)
    return out


def decode_ref(q, kv, seq_lens, scale, opts):
    refs = []
    for i, n in enumerate(seq_lens):
        k, v = gather(kv, i, n)
        refs.append(
            attention_ref(
                q[i : i + 1].cpu(),
                k,
                v,
                torch.tensor([n - 1]),
                scale,
                opts["alibi"],
                opts["softcap"],
                opts["window"],
            )
        )
    return torch.cat(refs)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_decode(head_size, dtype, layout):
    r, gen = _rng()
    for _ in range(2):
        hkv = r.choice([1, 2, 4])
        group = r.choice([1, 2, 3, 4, 8, 16])
        bs = r.choice([8, 16, 32])
        seq_lens = [r.randint(1, 1300) for _ in range(r.randint(1, 4))]
        q = torch.randn(len(seq_lens), hkv * group, head_size, generator=gen).to(dtype).cuda()
        kv = make_paged_kv(gen, seq_lens, hkv, head_size, bs, dtype, layout)
        opts = _options(r, hkv * group, False)
        scale = head_size**-0.5
        partition = r.choice([0, 512, bs * r.choice([1, 4, 8])])
        out = run_decode(q, kv, seq_lens, hkv, scale, opts, "auto", 1.0, 1.0, partition)
        torch.cuda.synchronize()
        ref = decode_ref(q, kv, seq_lens, scale, opts)
        err = rel_err(out, ref)
        assert err < TOL[dtype], (err, hkv, group, bs, seq_lens, partition, opts)
        cpu = run_decode(q, kv, seq_lens, hkv, scale, opts, "auto", 1.0, 1.0, partition, "cpu")
        assert rel_err(out, cpu.double()) < 2 * TOL[dtype]  # the CPU op agrees


@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_fp8(kv_dtype, layout, dtype):
    r, gen = _rng()
    for _ in range(3):
        head_size = r.choice([h for h in HEAD_SIZES if layout == "nhd" or h % 16 == 0])
        hkv, group, bs = r.choice([1, 2]), r.choice([1, 4, 8]), r.choice([8, 16])
        seq_lens = [r.randint(1, 1100) for _ in range(r.randint(1, 3))]
        ks, vs = r.uniform(0.2, 2.0), r.uniform(0.2, 2.0)
        q = torch.randn(len(seq_lens), hkv * group, head_size, generator=gen).to(dtype).cuda()
        kv = make_paged_kv(gen, seq_lens, hkv, head_size, bs, dtype, layout, kv_dtype, ks, vs)
        opts = {"alibi": None, "softcap": 0.0, "window": 0}
        scale = head_size**-0.5
        out = run_decode(q, kv, seq_lens, hkv, scale, opts, kv_dtype, ks, vs, r.choice([0, 256]))
        torch.cuda.synchronize()
        err = rel_err(out, decode_ref(q, kv, seq_lens, scale, opts))
        assert err < TOL[dtype], (err, head_size, hkv, group, seq_lens)


def test_decode_v2_partials():
    """v2's exp_sums / max_logits / tmp_out follow vLLM: per partition, natural-log max."""
    r, gen = _rng()
    seq_lens, hkv, group, d, ps = [700, 1, 1025], 2, 4, 64, 256
    q = torch.randn(3, hkv * group, d, generator=gen).half().cuda()
    kv = make_paged_kv(gen, seq_lens, hkv, d, 16, torch.float16, "nhd")
    parts = math.ceil(max(seq_lens) / ps)
    out = torch.full_like(q, float("nan"))
    es = torch.full((3, hkv * group, parts), float("nan"), device="cuda")
    ml, tmp = es.clone(), torch.full((3, hkv * group, parts, d), float("nan"), device="cuda")
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    ops.paged_attention_v2(
        out,
        es,
        ml,
        tmp,
        q,
        kv.key_cache,
        kv.value_cache,
        hkv,
        d**-0.5,
        kv.block_tables,
        sl,
        16,
        max(seq_lens),
        None,
        "auto",
        1.0,
        1.0,
        partition_size=ps,
    )
    torch.cuda.synchronize()
    for s, n in enumerate(seq_lens):
        k, v = gather(kv, s, n)
        kk = k.repeat_interleave(group, 1)
        logits = torch.einsum("hd,khd->hk", q[s].cpu().double(), kk) * d**-0.5
        for p in range(math.ceil(n / ps)):
            seg = logits[:, p * ps : min(n, (p + 1) * ps)]
            mx = seg.max(-1).values
            torch.testing.assert_close(ml[s, :, p].cpu().double(), mx, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(
                es[s, :, p].cpu().double(), (seg - mx[:, None]).exp().sum(-1), rtol=1e-4, atol=1e-4
            )


def run_prefill(
    q, k, v, kv, qsl, seq_lens, scale, opts, kv_dtype, ks, vs, device="cuda", kernel="auto"
):
    mv = (lambda x: x.to(device)) if device == "cpu" else (lambda x: x)
    q, k, v = mv(q), mv(k), mv(v)
    out = torch.full_like(q, float("nan"))
    qsl_t = torch.tensor(qsl, dtype=torch.int32, device=device)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    max_q = max(qsl[i + 1] - qsl[i] for i in range(len(seq_lens)))
    alibi = None if opts["alibi"] is None else mv(opts["alibi"])
    ops.context_attention_fwd(
        q,
        k,
        v,
        out,
        kv_dtype,
        mv(kv.key_cache),
        mv(kv.value_cache),
        mv(kv.block_tables),
        qsl_t,
        sl,
        None,
        max_q,
        ks,
        vs,
        alibi,
        opts["window"] or None,
        scale,
        logits_soft_cap=opts["softcap"],
        kernel=kernel,
    )
    return out


def prefill_ref(q, k, v, kv, qsl, ctx_lens, scale, opts):
    refs = []
    for i, c in enumerate(ctx_lens):
        a, b = qsl[i], qsl[i + 1]
        kc, vc = gather(kv, i, c)
        kk = torch.cat([kc, k[a:b].cpu().double()])
        vv = torch.cat([vc, v[a:b].cpu().double()])
        pos = torch.arange(c, c + b - a)
        refs.append(
            attention_ref(
                q[a:b].cpu(), kk, vv, pos, scale, opts["alibi"], opts["softcap"], opts["window"]
            )
        )
    return torch.cat(refs)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_prefill(head_size, dtype, layout):
    r, gen = _rng()
    for _ in range(2):
        hkv, group, bs = r.choice([1, 2]), r.choice([1, 2, 4, 8]), r.choice([8, 16, 32])
        n = r.randint(1, 4)
        ctx = [r.choice([0, r.randint(1, 400)]) for _ in range(n)]
        qlen = [r.randint(1, 200) for _ in range(n)]
        qsl = [0, *itertools.accumulate(qlen)]
        seq_lens = [c + x for c, x in zip(ctx, qlen)]
        hq = hkv * group
        q = torch.randn(qsl[-1], hq, head_size, generator=gen).to(dtype).cuda()
        k = torch.randn(qsl[-1], hkv, head_size, generator=gen).to(dtype).cuda()
        v = torch.randn(qsl[-1], hkv, head_size, generator=gen).to(dtype).cuda()
        kv = make_paged_kv(gen, ctx, hkv, head_size, bs, dtype, layout)
        opts = _options(r, hq, True)
        scale = head_size**-0.5
        out = run_prefill(q, k, v, kv, qsl, seq_lens, scale, opts, "auto", 1.0, 1.0)
        torch.cuda.synchronize()
        err = rel_err(out, prefill_ref(q, k, v, kv, qsl, ctx, scale, opts))
        assert err < TOL[dtype], (err, hkv, group, bs, ctx, qlen, opts)
        cpu = run_prefill(q, k, v, kv, qsl, seq_lens, scale, opts, "auto", 1.0, 1.0, "cpu")
        assert rel_err(out, cpu.double()) < 2 * TOL[dtype]  # the CPU op agrees


@pytest.mark.parametrize("kernel", ["tensor_core", "cuda_core"])
@pytest.mark.parametrize("kv_dtype", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_fp8(kv_dtype, dtype, kernel):
    """fp8 caches on the tensor-core prefill (it dequantises the context into its tiles) and on
    the CUDA-core kernel, each named (required)."""
    r, gen = _rng()
    for layout in LAYOUTS:
        head_size = r.choice([64, 128, 256])
        hkv, group = 2, r.choice([1, 4])
        ctx = [r.randint(0, 300) for _ in range(2)]
        qlen = [r.randint(1, 100) for _ in range(2)]
        qsl = [0, qlen[0], qlen[0] + qlen[1]]
        ks, vs = r.uniform(0.2, 2.0), r.uniform(0.2, 2.0)
        q = torch.randn(qsl[-1], hkv * group, head_size, generator=gen).to(dtype).cuda()
        k = torch.randn(qsl[-1], hkv, head_size, generator=gen).to(dtype).cuda()
        v = torch.randn(qsl[-1], hkv, head_size, generator=gen).to(dtype).cuda()
        kv = make_paged_kv(gen, ctx, hkv, head_size, 16, dtype, layout, kv_dtype, ks, vs)
        opts = {"alibi": None, "softcap": 0.0, "window": 0}
        out = run_prefill(
            q,
            k,
            v,
            kv,
            qsl,
            [c + x for c, x in zip(ctx, qlen)],
            head_size**-0.5,
            opts,
            kv_dtype,
            ks,
            vs,
            kernel=kernel,
        )
        torch.cuda.synchronize()
        err = rel_err(out, prefill_ref(q, k, v, kv, qsl, ctx, head_size**-0.5, opts))
        assert err < TOL[dtype], (err, layout, head_size, ctx, qlen)


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache(kv_dtype, layout, dtype):
    r, gen = _rng()
    head_size = r.choice([h for h in HEAD_SIZES if layout == "nhd" or h % 16 == 0])
    nb, bs, h = r.randint(4, 40), r.choice([8, 16, 32]), r.choice([1, 3, 8])
    ntok = r.randint(1, nb * bs // 2)
    slots = torch.randperm(nb * bs, generator=gen)[:ntok]
    slots[torch.rand(ntok, generator=gen) < 0.1] = -1  # padding tokens are skipped
    key = torch.randn(ntok, h, head_size, generator=gen).to(dtype)
    val = torch.randn(ntok, h, head_size, generator=gen).to(dtype)
    ks, vs = (r.uniform(0.2, 2.0), r.uniform(0.2, 2.0)) if kv_dtype != "auto" else (1.0, 1.0)
    cdt = torch.uint8 if kv_dtype != "auto" else dtype
    logical_k = torch.randn(nb, bs, h, head_size, generator=gen).to(dtype)
    logical_v = torch.randn(nb, bs, h, head_size, generator=gen).to(dtype)
    if kv_dtype != "auto":
        logical_k = quantize(logical_k, kv_dtype, 1.0)
        logical_v = quantize(logical_v, kv_dtype, 1.0)
    kc = to_layout(logical_k, layout, False).cuda()
    vc = to_layout(logical_v, layout, True).cuda()
    write = ops.reshape_and_cache_flash if layout == "nhd" else ops.reshape_and_cache
    write(key.cuda(), val.cuda(), kc, vc, slots.cuda(), kv_dtype, ks, vs)
    torch.cuda.synchronize()
    exp_k, exp_v = logical_k.clone(), logical_v.clone()
    keep = slots >= 0
    sk, sv = key[keep], val[keep]
    if kv_dtype != "auto":
        sk, sv = quantize(sk, kv_dtype, ks), quantize(sv, kv_dtype, vs)
    s = slots[keep]
    exp_k[s // bs, s % bs] = sk.to(cdt)
    exp_v[s // bs, s % bs] = sv.to(cdt)
    got_k = from_layout(kc.cpu(), layout, False)
    got_v = from_layout(vc.cpu(), layout, True)
    assert torch.equal(got_k.view(torch.uint8) if cdt == torch.uint8 else got_k, exp_k)
    assert torch.equal(got_v.view(torch.uint8) if cdt == torch.uint8 else got_v, exp_v)
    if kv_dtype != "auto":  # round trip within fp8 precision
        back = dequantize(got_k[s // bs, s % bs], kv_dtype, ks)
        assert rel_err(back, key[keep].double()) < (0.07 if kv_dtype == "fp8" else 0.14)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_copy_blocks(layout):
    r, gen = _rng()
    layers, nb = r.randint(1, 40), 24
    shape = (nb, 16, 2, 64) if layout == "nhd" else (nb, 2, 8, 16, 8)
    vshape = (nb, 16, 2, 64) if layout == "nhd" else (nb, 2, 64, 16)
    kcs = [torch.randn(shape, generator=gen).half().cuda() for _ in range(layers)]
    vcs = [torch.randn(vshape, generator=gen).half().cuda() for _ in range(layers)]
    src = torch.randperm(nb, generator=gen)[:6]
    dst = torch.randperm(nb, generator=gen)
    dst = dst[~torch.isin(dst, src)][:6]
    mapping = torch.stack([src, dst], 1).long()
    exp_k = [t.clone() for t in kcs]
    exp_v = [t.clone() for t in vcs]
    for t in exp_k + exp_v:
        t[dst.cuda()] = t[src.cuda()]
    for dev in ("cuda",):
        ops.copy_blocks(kcs, vcs, mapping.to(dev))
        torch.cuda.synchronize()
        for a, b in zip(kcs + vcs, exp_k + exp_v):
            assert torch.equal(a, b)


def test_swap_blocks():
    r, gen = _rng()
    nb = 16
    gpu = torch.randn(nb, 16, 4, 64, generator=gen).bfloat16().cuda()
    host = torch.randn(nb, 16, 4, 64, generator=gen).bfloat16().pin_memory()
    out_map = torch.tensor([[1, 5], [3, 0], [7, 15]], dtype=torch.int64)
    exp_host = host.clone()
    exp_host[out_map[:, 1]] = gpu.cpu()[out_map[:, 0]]
    ops.swap_blocks(gpu, host, out_map)  # swap out
    torch.cuda.synchronize()
    assert torch.equal(host, exp_host)
    in_map = torch.tensor([[5, 2], [0, 9]], dtype=torch.int64)
    exp_gpu = gpu.cpu().clone()
    exp_gpu[in_map[:, 1]] = host[in_map[:, 0]]
    ops.swap_blocks(host, gpu, in_map)  # swap in
    torch.cuda.synchronize()
    assert torch.equal(gpu.cpu(), exp_gpu)
    pageable = torch.zeros(nb, 16, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pinned"):
        ops.swap_blocks(gpu, pageable, out_map)


def test_malformed_calls_raise_or_stay_safe():
    """Device mixes raise ValueError; out-of-range ids held on the GPU (which the op cannot read
    without a synchronisation) must neither crash nor corrupt the CUDA context."""
    r, gen = _rng()
    kv = make_paged_kv(gen, [40, 70], 2, 64, 16, torch.float16, "nhd")
    q = torch.randn(2, 4, 64, generator=gen).half().cuda()
    out = torch.empty_like(q)
    sl = torch.tensor([40, 70], dtype=torch.int32, device="cuda")
    args = (2, 0.125, kv.block_tables, sl, 16, 70)
    with pytest.raises(ValueError):  # query on the GPU, cache on the CPU
        ops.paged_attention_v1(out, q, kv.key_cache.cpu(), kv.value_cache.cpu(), *args)
    with pytest.raises(ValueError):  # output on the CPU
        ops.paged_attention_v1(out.cpu(), q, kv.key_cache, kv.value_cache, *args)
    with pytest.raises(ValueError):  # key on the GPU, slots on the CPU
        ops.reshape_and_cache_flash(
            q[:, :2],
            q[:, :2],
            kv.key_cache,
            kv.value_cache,
            torch.zeros(2, dtype=torch.int64),
            "auto",
            1.0,
            1.0,
        )
    bad = kv.block_tables.clone()
    bad[0, 0] = 1 << 30
    bad[1, 1] = -5
    ops.paged_attention_v1(out, q, kv.key_cache, kv.value_cache, 2, 0.125, bad, sl, 16, 70)
    huge = torch.tensor([40, 1 << 20], dtype=torch.int32, device="cuda")  # past the table
    ops.paged_attention_v1(
        out, q, kv.key_cache, kv.value_cache, 2, 0.125, kv.block_tables, huge, 16, 1 << 20
    )
    slots = torch.tensor([1 << 40, -1], dtype=torch.int64, device="cuda")
    ops.reshape_and_cache_flash(
        q[:, :2], q[:, :2], kv.key_cache, kv.value_cache, slots, "auto", 1.0, 1.0
    )
    torch.cuda.synchronize()  # the context is still healthy: a valid call works
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        out.fill_(float("nan"))
        ops.paged_attention_v1(out, q, kv.key_cache, kv.value_cache, *args)
    s.synchronize()
    ref = decode_ref(q, kv, [40, 70], 0.125, {"alibi": None, "softcap": 0.0, "window": 0})
    assert rel_err(out, ref) < TOL[torch.float16]


def test_stream_arguments():
    """``stream=`` takes a torch.cuda.Stream or an int handle: the op runs on that stream (its
    result is complete once that stream is synchronised) and matches the reference."""
    r, gen = _rng()
    kv = make_paged_kv(gen, [33, 90], 2, 64, 16, torch.float16, "nhd")
    q = torch.randn(2, 4, 64, generator=gen).half().cuda()
    sl = torch.tensor([33, 90], dtype=torch.int32, device="cuda")
    ref = decode_ref(q, kv, [33, 90], 0.125, {"alibi": None, "softcap": 0.0, "window": 0})
    side = torch.cuda.Stream()
    for stream in (side, side.cuda_stream):
        out = torch.full_like(q, float("nan"))
        side.wait_stream(torch.cuda.current_stream())
        ops.paged_attention_v1(
            out,
            q,
            kv.key_cache,
            kv.value_cache,
            2,
            0.125,
            kv.block_tables,
            sl,
            16,
            90,
            stream=stream,
        )
        side.synchronize()
        assert rel_err(out, ref) < TOL[torch.float16]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs 2 GPUs (a stream of one GPU with arrays on another)",
)
def test_stream_of_another_gpu_raises():
    """A stream that belongs to another GPU than the arrays raises a ValueError naming
    ``stream`` (every CUDA op), and the arrays' own GPU keeps working."""
    r, gen = _rng()
    kv = make_paged_kv(gen, [40, 70], 2, 64, 16, torch.float16, "nhd")
    q = torch.randn(2, 4, 64, generator=gen).half().cuda(0)
    out = torch.empty_like(q)
    sl = torch.tensor([40, 70], dtype=torch.int32, device="cuda:0")
    other = torch.cuda.Stream(device=1)
    with pytest.raises(ValueError, match="stream"):
        ops.paged_attention_v1(
            out,
            q,
            kv.key_cache,
            kv.value_cache,
            2,
            0.125,
            kv.block_tables,
            sl,
            16,
            70,
            stream=other,
        )
    with pytest.raises(ValueError, match="stream"):
        ops.reshape_and_cache_flash(
            q[:, :2],
            q[:, :2],
            kv.key_cache,
            kv.value_cache,
            torch.zeros(2, dtype=torch.int64, device="cuda:0"),
            "auto",
            1.0,
            1.0,
            stream=other,
        )
    with pytest.raises(ValueError, match="stream"):
        ops.copy_blocks(
            [kv.key_cache],
            [kv.value_cache],
            torch.tensor([[0, 1]], dtype=torch.int64, device="cuda:0"),
            stream=other,
        )
    ops.paged_attention_v1(
        out, q, kv.key_cache, kv.value_cache, 2, 0.125, kv.block_tables, sl, 16, 70
    )
    ref = decode_ref(q, kv, [40, 70], 0.125, {"alibi": None, "softcap": 0.0, "window": 0})
    assert rel_err(out, ref) < TOL[torch.float16]
