"""The work-balanced decode on the GPU (ops.paged_attention_balanced on the Hopper decode: each
CTA row reads its work item from the plan; the split-K reduction merges a variable number of
partials per sequence) against a float64 reference, on the random cases of the Hopper decode
tests, and inside a CUDA graph whose plan is refilled between replays."""

from __future__ import annotations

import random

import pytest
from support.deps import need

torch = need("torch")

import test_decode_mma_cuda as mma_tests  # noqa: E402
from pagedkv import ops  # noqa: E402
from support.cuda_cases import TOL, make_paged_kv, rel_err  # noqa: E402
from test_ops_cuda import decode_ref  # noqa: E402

pytestmark = pytest.mark.cuda

FP8_HEAD_SIZES = [h for h in mma_tests.MMA_HEAD_SIZES if h % 32 == 0]


@pytest.fixture(autouse=True)
def _hopper_decode():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the balanced decode runs on the Hopper decode (compute capability 9.x)")


class Plan:
    """A plan of fixed capacity in host and device arrays (as the engine keeps it)."""

    def __init__(self, capacity: int, num_seqs: int, heads: int, head_size: int) -> None:
        self.items = torch.zeros(capacity, ops.BALANCED_ITEM_INTS, dtype=torch.int32)
        self.offsets = torch.zeros(num_seqs + 1, dtype=torch.int32)
        self.d_items, self.d_offsets = self.items.cuda(), self.offsets.cuda()
        self.es = torch.full((capacity, heads), float("nan"), device="cuda")
        self.ml = torch.full_like(self.es, float("nan"))
        self.tmp = torch.full((capacity, heads, head_size), float("nan"), device="cuda")

    def fill(self, seq_lens: list[int], target: int, window: int, min_chunk: int) -> int:
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        used = ops.plan_balanced_decode(
            lens, self.items, self.offsets, target, window or None, min_chunk
        )
        self.d_items.copy_(self.items)
        self.d_offsets.copy_(self.offsets)
        return used


def _run(plan, q, kv, sl, max_len, hkv, scale, opts, kv_dtype, ks, vs, out, kernel="hopper"):
    ops.paged_attention_balanced(
        out,
        plan.es,
        plan.ml,
        plan.tmp,
        q,
        kv.key_cache,
        kv.value_cache,
        hkv,
        scale,
        kv.block_tables,
        sl,
        plan.d_items,
        plan.d_offsets,
        max_len,
        opts["alibi"],
        kv_dtype,
        ks,
        vs,
        logits_soft_cap=opts["softcap"],
        sliding_window=opts["window"] or None,
        kernel=kernel,
    )


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_balanced_random(dtype, kv_dtype):
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    sizes = mma_tests.MMA_HEAD_SIZES if kv_dtype == "auto" else FP8_HEAD_SIZES
    for _ in range(10):
        q, kv, seq_lens, hkv, opts, ks, vs, _ = mma_tests._case(
            r, gen, kv_dtype, "nhd", dtype, sizes
        )
        seq_lens[0] = r.choice([seq_lens[0], 0, 4000])  # empty and long sequences too
        kv = make_paged_kv(
            gen, seq_lens, hkv, q.shape[-1], kv.block_size, dtype, "nhd", kv_dtype, ks, vs
        )
        target = r.choice([1, 3, 16, 64])
        plan = Plan(
            ops.balanced_plan_capacity(target, len(seq_lens)) + r.choice([0, 5]),
            len(seq_lens),
            q.shape[1],
            q.shape[2],
        )
        plan.fill(seq_lens, target, opts["window"], r.choice([32, 64, 128]))
        out = torch.full_like(q, float("nan"))
        sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
        scale = q.shape[-1] ** -0.5
        _run(
            plan,
            q,
            kv,
            sl,
            max(seq_lens),
            hkv,
            scale,
            opts,
            kv_dtype,
            ks,
            vs,
            out,
            kernel=r.choice(["hopper", "auto"]),
        )
        torch.cuda.synchronize()
        ref = decode_ref(q, kv, seq_lens, scale, opts)
        if seq_lens[0] == 0:
            assert (out[0] == 0).all()
        err = rel_err(out, ref)
        assert err < TOL[dtype], (
            seed,
            err,
            q.shape,
            hkv,
            kv.block_size,
            seq_lens,
            target,
            opts["window"],
        )


def test_balanced_graph_replays_a_refilled_plan():
    """A graph captured once replays correctly after the plan and seq_lens are refilled for new
    lengths (launch shapes depend on the capacity only)."""
    gen = torch.Generator().manual_seed(5)
    hkv, group, d, bs, dtype = 8, 4, 128, 16, torch.bfloat16
    first, second = [3000, 40, 700, 1], [17, 2900, 2900, 256]
    kv = make_paged_kv(gen, [3000] * 4, hkv, d, bs, dtype, "nhd")
    q = torch.randn(4, hkv * group, d, generator=gen).to(dtype).cuda()
    target = 24
    plan = Plan(ops.balanced_plan_capacity(target, 4), 4, hkv * group, d)
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    sl = torch.tensor(first, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    plan.fill(first, target, 0, 128)
    call = lambda: _run(plan, q, kv, sl, 3000, hkv, d**-0.5, opts, "auto", 1.0, 1.0, out)  # noqa: E731
    call()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        call()
    for lens in (second, first):
        plan.fill(lens, target, 0, 128)
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert rel_err(out, decode_ref(q, kv, lens, d**-0.5, opts)) < TOL[dtype], lens


def test_balanced_refuses_other_kernels():
    gen = torch.Generator().manual_seed(1)
    kv = make_paged_kv(gen, [100], 1, 64, 16, torch.float16, "nhd")
    q = torch.randn(1, 4, 64, generator=gen).half().cuda()
    plan = Plan(4, 1, 4, 64)
    plan.fill([100], 2, 0, 32)
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    sl = torch.tensor([100], dtype=torch.int32, device="cuda")
    for kernel in ("tensor_core", "cuda_core"):
        with pytest.raises(ValueError, match="has no balanced variant"):
            _run(plan, q, kv, sl, 100, 1, 0.1, opts, "auto", 1.0, 1.0, torch.empty_like(q), kernel)
    vllm = make_paged_kv(gen, [100], 1, 64, 16, torch.float16, "vllm")
    with pytest.raises(ValueError, match="does not cover this call"):
        _run(plan, q, vllm, sl, 100, 1, 0.1, opts, "auto", 1.0, 1.0, torch.empty_like(q))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cascade_decode_matches_reference(dtype):
    """A shared prefix (sequence 0's whole blocks) attended once for 8 sequences (the stacked
    group of 32 heads per KV head), merged with each one's own keys; merge_attn_states on the GPU
    against the CPU op."""
    from pagedkv.cascade import cascade_decode

    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    hkv, group, d, bs, prefix = 2, 4, 128, 16, 1024
    own = [r.choice([0, 1, 37, 256, r.randint(1, 300)]) for _ in range(8)]
    kv = make_paged_kv(gen, [prefix] + own, hkv, d, bs, dtype, "nhd")
    q = torch.randn(len(own), hkv * group, d, generator=gen).to(dtype).cuda()
    scale = d**-0.5
    out = cascade_decode(
        q,
        kv.key_cache,
        kv.value_cache,
        hkv,
        scale,
        kv.block_tables[:1, : prefix // bs].contiguous(),
        prefix,
        kv.block_tables[1:].contiguous(),
        torch.tensor(own, dtype=torch.int32, device="cuda"),
    )
    torch.cuda.synchronize()
    # The reference over each sequence's whole context: the shared blocks, then its own.
    full = torch.cat(
        [kv.block_tables[:1, : prefix // bs].expand(len(own), -1), kv.block_tables[1:]], dim=1
    )
    whole = type(kv)(kv.key_cache, kv.value_cache, kv.k_logical, kv.v_logical, full, bs)
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    ref = decode_ref(q, whole, [prefix + n for n in own], scale, opts)
    assert rel_err(out, ref) < TOL[dtype], (seed, own)

    t, h = 5, 8
    po, so = (torch.randn(t, h, d, generator=gen).to(dtype) for _ in range(2))
    pl, sl = (torch.randn(h, t, generator=gen) * 3 for _ in range(2))
    pl[0, 0] = -float("inf")
    outs = []
    for dev in ("cpu", "cuda"):
        o = torch.empty(t, h, d, dtype=dtype, device=dev)
        lse = torch.empty(h, t, device=dev)
        ops.merge_attn_states(o, po.to(dev), pl.to(dev), so.to(dev), sl.to(dev), lse)
        outs.append((o.cpu().float(), lse.cpu()))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-2)
    assert torch.allclose(outs[0][1], outs[1][1], atol=1e-4)
