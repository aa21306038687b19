"""The tensor-core decode path (fp16/bf16 queries, head sizes multiple of 16) against a float64
reference over random shapes: GQA groups past 16 query heads (several CTAs per KV head), MQA,
fp8 caches in both layouts, block sizes 8..64, split-K partitions that cut chunks of 16 keys,
sliding windows, alibi and soft-cap; outputs and v2 workspaces are NaN-poisoned. Also the
library's split-K choice (PagedAttention.forward_decode on CUDA)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from support.deps import need

torch = need("torch")

import test_cuda_graph  # noqa: E402
from pagedkv import ops  # noqa: E402
from pagedkv._C import build_info  # noqa: E402
from pagedkv.attention import PagedAttention, decode_partition_size  # noqa: E402
from support.cuda_cases import TOL, make_paged_kv, rel_err  # noqa: E402
from test_ops_cuda import decode_ref, run_decode  # noqa: E402

MMA_HEAD_SIZES = [h for h in ops.SUPPORTED_HEAD_SIZES if h % 16 == 0]  # what it covers


# These tests are the tensor-core kernel's: they name it, so the Hopper kernel
# (test_decode_bulk_cuda.py) cannot take their row-layout cases nor a fallback pass silently.
KERNEL = "tensor_core"


def _case(
    r: random.Random,
    gen: torch.Generator,
    kv_dtype: str,
    layout: str,
    dtype,
    head_sizes: list[int] = MMA_HEAD_SIZES,
):
    head_size = r.choice(head_sizes)
    hkv = r.choice([1, 2, 3])
    group = r.choice([1, 4, 5, 8, 16, 24, 32])
    bs = r.choice([8, 16, 32, 64] if kv_dtype == "auto" or layout == "nhd" else [16, 32])
    seq_lens = [r.choice([1, 15, 16, 17, r.randint(1, 3000)]) for _ in range(r.randint(1, 3))]
    ks, vs = (1.0, 1.0) if kv_dtype == "auto" else (r.uniform(0.3, 2.0), r.uniform(0.3, 2.0))
    q = torch.randn(len(seq_lens), hkv * group, head_size, generator=gen).to(dtype).cuda()
    kv = make_paged_kv(gen, seq_lens, hkv, head_size, bs, dtype, layout, kv_dtype, ks, vs)
    alibi = (torch.rand(hkv * group, generator=gen) * 0.2).cuda() if r.random() < 0.3 else None
    opts = {
        "alibi": alibi,
        "softcap": r.choice([0.0, 0.0, 20.0]),
        "window": r.choice([0, 0, r.randint(1, 700)]),
    }
    partition = r.choice([0, bs, 3 * bs, 128, 512])
    return q, kv, seq_lens, hkv, opts, ks, vs, partition


@pytest.mark.cuda
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_mma_random(dtype, layout, kv_dtype):
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(3):
        q, kv, seq_lens, hkv, opts, ks, vs, partition = _case(r, gen, kv_dtype, layout, dtype)
        scale = q.shape[-1] ** -0.5
        out = run_decode(
            q, kv, seq_lens, hkv, scale, opts, kv_dtype, ks, vs, partition, kernel=KERNEL
        )
        torch.cuda.synchronize()
        ref = decode_ref(q, kv, seq_lens, scale, opts)
        err = rel_err(out, ref)
        assert err < TOL[dtype], (
            seed,
            err,
            q.shape,
            hkv,
            kv.block_size,
            seq_lens,
            partition,
            opts["window"],
            opts["softcap"],
            opts["alibi"] is not None,
        )


def test_partition_heuristic():
    """The library's split-K rule (C++ ops::decode_partition_size) per kernel."""

    def rule(kernel, *args, kv="auto"):
        return decode_partition_size(*args, kernel=kernel, kv_cache_dtype=kv)

    # Tensor cores: small batches split to fill one wave (2 CTAs per SM); large ones don't.
    def tc(*args, kv="auto"):
        return rule("tensor_core", *args, kv=kv)

    assert tc(1, 32, 8, 32768, 16, 132) == 1008
    assert tc(1, 32, 8, 4096, 16, 132) == 128
    assert tc(16, 32, 8, 4096, 16, 132) == 2048
    assert tc(32, 32, 8, 8192, 16, 132) == 0
    assert tc(256, 32, 8, 512, 16, 132) == 0
    assert tc(1, 32, 8, 100, 16, 132) == 0  # shorter than one partition
    # fp8 caches: sized for 4 CTAs per SM.
    assert tc(16, 32, 8, 4096, 16, 132, kv="fp8") == 1024
    assert tc(1, 32, 8, 32768, 16, 132, kv="fp8_e5m2") == 512
    assert tc(32, 32, 8, 8192, 16, 132, kv="fp8") == 4096
    # The CUDA-core kernel wants ~8 CTAs per SM.
    assert rule("cuda_core", 1, 32, 8, 32768, 16, 132) == 256
    assert rule("cuda_core", 32, 32, 8, 8192, 16, 132) == 2048

    # The Hopper kernel, at the best fixed sizes of the H100 sweep (decode_variants.py
    # --partitions --every-shape, benchmarks/RESULTS.md) or within 2 % of them: 16-bit caches
    # split only to one CTA per SM, fp8 ones to every CTA slot (4 per SM) in >= 256-key parts
    # where that at least triples the CTAs.
    def hopper(*args, kv="auto"):
        return rule("hopper", *args, kv=kv)

    assert hopper(1, 32, 8, 4096, 16, 132) == 256
    assert hopper(1, 32, 8, 32768, 16, 132) == 2048
    assert hopper(16, 32, 8, 4096, 16, 132) == 0
    assert hopper(32, 32, 8, 8192, 16, 132) == 0
    assert hopper(1, 32, 8, 4096, 16, 132, kv="fp8") == 256
    assert hopper(1, 32, 8, 32768, 16, 132, kv="fp8_e5m2") == 512
    assert hopper(16, 32, 8, 4096, 16, 132, kv="fp8") == 1024
    assert hopper(64, 32, 8, 2048, 16, 132, kv="fp8") == 0  # 512 CTAs: the slots are full
    assert hopper(32, 32, 8, 8192, 16, 132, kv="fp8") == 0  # 256 CTAs: two parts lose
    assert hopper(8, 32, 8, 8192, 16, 132, kv="fp8") == 1024  # 64 CTAs: eight parts
    assert hopper(256, 32, 8, 512, 16, 132, kv="fp8") == 0
    assert hopper(2, 32, 8, 4096, 16, 132, kv="fp8") == 256  # at least 256 keys

    # The CPU: vLLM's rule (512-key partitions past one partition for small batches, always
    # past 8192 keys), rounded up to whole blocks.
    assert rule("cpu", 1, 32, 8, 4096, 16, 0) == 512
    assert rule("cpu", 64, 32, 8, 4096, 16, 0) == 0  # 2048 (sequence, head) pairs
    assert rule("cpu", 64, 32, 8, 16384, 16, 0) == 512
    assert rule("cpu", 1, 32, 8, 512, 16, 0) == 0
    assert rule("cpu", 1, 32, 8, 4096, 48, 0) == 528
    for _ in range(300):
        bs = random.choice([8, 16, 32, 48])
        n = random.randint(1, 100000)
        kernel = random.choice(["hopper", "tensor_core", "cuda_core", "cpu"])
        ps = rule(
            kernel,
            random.randint(1, 64),
            32,
            random.choice([1, 8, 32]),
            n,
            bs,
            random.choice([108, 132]),
            kv=random.choice(["auto", "fp8"]),
        )
        assert ps == 0 or (ps % bs == 0 and ps % 16 == 0 and 128 <= ps < n), (kernel, bs, n, ps)
    with pytest.raises(ValueError, match="kernel"):
        rule("bulk", 1, 32, 8, 4096, 16, 132)
    with pytest.raises(ValueError, match="block_size"):
        rule("hopper", 1, 32, 8, 4096, 0, 132)


def test_decode_kernel_choice():
    """ops.decode_kernel reports the kernel the decode ops run (the C++ side decides; the
    split-K choice of a call follows it), and bad calls raise naming the argument."""
    q = torch.zeros(2, 8, 64, dtype=torch.bfloat16)
    cache = torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)  # NHD
    assert ops.decode_kernel(q, cache, cache, 2) == "cpu"
    assert ops.decode_partition_size(q, cache, cache, 2, 4096) == 512  # vLLM's CPU rule
    assert ops.decode_partition_size(q, cache, cache, 2, 300) == 0
    with pytest.raises(ValueError, match="num_kv_heads"):
        ops.decode_kernel(q, cache, cache, 3)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        ops.decode_kernel(q, cache, cache, 2, "int4")
    with pytest.raises(ValueError, match="max_seq_len"):
        ops.decode_partition_size(q, cache, cache, 2, -1)
    small = torch.zeros(4, 16, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="head size"):
        ops.decode_kernel(q, small, small, 2)
    # A kernel is chosen by argument: the host's own, or a refusal naming why.
    assert ops.decode_kernel(q, cache, cache, 2, kernel="cpu") == "cpu"
    with pytest.raises(ValueError, match="kernel 'hopper' runs on CUDA arrays"):
        ops.decode_kernel(q, cache, cache, 2, kernel="hopper")
    with pytest.raises(ValueError, match="kernel must be 'auto', 'cpu'"):
        ops.decode_kernel(q, cache, cache, 2, kernel="bulk")
    with pytest.raises(ValueError, match="'auto' is a choice"):
        decode_partition_size(1, 32, 8, 4096, 16, 132, kernel="auto")


@pytest.mark.cuda
def test_decode_kernel_choice_on_cuda():
    q = torch.zeros(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    nhd = torch.zeros(4, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
    vllm_k = torch.zeros(4, 2, 16, 16, 8, dtype=torch.bfloat16, device="cuda")
    vllm_v = torch.zeros(4, 2, 128, 16, dtype=torch.bfloat16, device="cuda")
    hopper = torch.cuda.get_device_capability()[0] == 9 and "90a" in build_info()["cuda_archs"]
    assert ops.decode_kernel(q, nhd, nhd, 2) == ("hopper" if hopper else "tensor_core")
    assert ops.decode_kernel(q, vllm_k, vllm_v, 2) == "tensor_core"  # no Hopper kernel there
    assert ops.decode_kernel(q.float(), nhd.float(), nhd.float(), 2) == "cuda_core"
    assert ops.decode_kernel(q, nhd, nhd, 2, kernel="tensor_core") == "tensor_core"
    assert ops.decode_kernel(q, nhd, nhd, 2, kernel="cuda_core") == "cuda_core"
    with pytest.raises(ValueError, match="kernel 'tensor_core' does not cover.*float16"):
        ops.decode_kernel(q.float(), nhd.float(), nhd.float(), 2, kernel="tensor_core")
    with pytest.raises(ValueError, match="kernel 'cpu' runs on host arrays"):
        ops.decode_kernel(q, nhd, nhd, 2, kernel="cpu")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in (1, 2, 64):
        kernel = ops.decode_kernel(q[:1].repeat(n, 1, 1), nhd, nhd, 2)
        want = decode_partition_size(n, 8, 2, 32768, 16, sms, kernel=kernel)
        assert ops.decode_partition_size(q[:1].repeat(n, 1, 1), nhd, nhd, 2, 32768) == want
        # The split follows a named kernel too.
        want = decode_partition_size(n, 8, 2, 32768, 16, sms, kernel="cuda_core")
        assert (
            ops.decode_partition_size(q[:1].repeat(n, 1, 1), nhd, nhd, 2, 32768, kernel="cuda_core")
            == want
        )


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_forward_decode_split_on_cuda(layout):
    """PagedAttention.forward_decode picks its own split for a small batch with long contexts."""
    seed = random.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    seq_lens, hkv, group, d, bs = [5000, 77], 2, 4, 128, 16
    q = torch.randn(2, hkv * group, d, generator=gen).to(torch.bfloat16).cuda()
    kv = make_paged_kv(gen, seq_lens, hkv, d, bs, torch.bfloat16, layout)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = ops.decode_kernel(q, kv.key_cache, kv.value_cache, hkv)
    assert decode_partition_size(2, hkv * group, hkv, max(seq_lens), bs, sms, kernel=kernel) > 0
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    out = PagedAttention.forward_decode(
        q,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        sl,
        max(seq_lens),
        "auto",
        hkv,
        d**-0.5,
        None,
        1.0,
        1.0,
    )
    torch.cuda.synchronize()
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    assert rel_err(out, decode_ref(q, kv, seq_lens, d**-0.5, opts)) < TOL[torch.bfloat16], seed


@pytest.mark.cuda
def test_decode_mma_matches_cuda_core_kernel():
    """fp32 queries keep the CUDA-core kernel: on the same data (rounded to bf16) both paths
    agree with each other to bf16 accuracy."""
    seed = random.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    seq_lens, hkv, group, d = [333, 1200], 2, 8, 128
    kv = make_paged_kv(gen, seq_lens, hkv, d, 16, torch.bfloat16, "nhd")
    q = torch.randn(2, hkv * group, d, generator=gen).to(torch.bfloat16).cuda()
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    fast = run_decode(q, kv, seq_lens, hkv, d**-0.5, opts, "auto", 1.0, 1.0, 256, kernel=KERNEL)
    kv32 = dataclasses.replace(
        kv, key_cache=kv.key_cache.float(), value_cache=kv.value_cache.float()
    )
    slow = run_decode(q.float(), kv32, seq_lens, hkv, d**-0.5, opts, "auto", 1.0, 1.0, 256)
    torch.cuda.synchronize()
    assert rel_err(fast, slow.double().cpu()) < TOL[torch.bfloat16], seed
    assert math.isfinite(float(fast.float().abs().max()))


@pytest.mark.cuda
@pytest.mark.parametrize("partition_size", [0, 128])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_decode_mma_graph_replay(layout, partition_size):
    """The CUDA-graph replay test of test_cuda_graph.py on the tensor-core kernel."""
    test_cuda_graph.test_decode_graph_replay(layout, partition_size, KERNEL)
