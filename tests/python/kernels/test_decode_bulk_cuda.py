"""The Hopper decode (decode_bulk.cuh: bulk copies, keys as the rows of transposed tensor-core
tiles, fp8 converted in registers) against a float64 reference, on the random cases of the
tensor-core decode tests restricted to what it covers (row layouts; fp8 with head sizes that
are multiples of 32). Every call names the kernel (kernel="hopper"), which makes an uncovered call
raise, so a silent fallback to another kernel fails these tests instead of passing them."""

from __future__ import annotations

import random

import pytest
from support.deps import need

torch = need("torch")

import test_cuda_graph  # noqa: E402
import test_decode_mma_cuda as mma_tests  # noqa: E402
from support.cuda_cases import TOL, make_paged_kv, rel_err  # noqa: E402
from test_ops_cuda import decode_ref, run_decode  # noqa: E402

pytestmark = pytest.mark.cuda

FP8_HEAD_SIZES = [h for h in mma_tests.MMA_HEAD_SIZES if h % 32 == 0]


KERNEL = "hopper"


@pytest.fixture(autouse=True)
def _hopper_decode():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the Hopper decode needs a compute capability 9.x GPU")


# The random cases cover both copy forms: tensor copies where they apply (rows of a multiple of
# 128 bytes, block sizes of a multiple of 16), row copies elsewhere (head size 32 in 16 bits, 64 in
# fp8, blocks of 8).
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_bulk_random(dtype, kv_dtype):
    seed = random.randrange(1 << 30)
    r, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    sizes = mma_tests.MMA_HEAD_SIZES if kv_dtype == "auto" else FP8_HEAD_SIZES
    for _ in range(12):
        q, kv, seq_lens, hkv, opts, ks, vs, partition = mma_tests._case(
            r, gen, kv_dtype, "nhd", dtype, sizes
        )
        scale = q.shape[-1] ** -0.5
        out = run_decode(
            q, kv, seq_lens, hkv, scale, opts, kv_dtype, ks, vs, partition, kernel=KERNEL
        )
        torch.cuda.synchronize()
        err = rel_err(out, decode_ref(q, kv, seq_lens, scale, opts))
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


def test_decode_bulk_scales_large_bf16_queries_into_fp16():
    """fp8 caches run fp16 MMAs: bf16 queries far past fp16's range must still be exact up to
    bf16 rounding (the kernel scales them by a power of two)."""
    seed = random.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    seq_lens, hkv, group, d = [700, 33], 2, 4, 128
    kv = make_paged_kv(gen, seq_lens, hkv, d, 16, torch.bfloat16, "nhd", "fp8", 0.5, 1.5)
    q = (torch.randn(2, hkv * group, d, generator=gen) * 1e6).to(torch.bfloat16).cuda()
    scale = 1e-6 * d**-0.5
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    out = run_decode(q, kv, seq_lens, hkv, scale, opts, "fp8", 0.5, 1.5, 0, kernel=KERNEL)
    torch.cuda.synchronize()
    assert rel_err(out, decode_ref(q, kv, seq_lens, scale, opts)) < TOL[torch.bfloat16], seed


def test_decode_bulk_refuses_what_it_does_not_cover():
    """Named, the Hopper decode refuses a call it does not cover (the vLLM layout) and says why."""
    gen = torch.Generator().manual_seed(0)
    kv = make_paged_kv(gen, [40], 1, 64, 16, torch.float16, "vllm")
    q = torch.randn(1, 4, 64, generator=gen).half().cuda()
    opts = {"alibi": None, "softcap": 0.0, "window": 0}
    with pytest.raises(ValueError, match="kernel 'hopper' does not cover this call.*row"):
        run_decode(q, kv, [40], 1, 0.125, opts, "auto", 1.0, 1.0, 0, kernel=KERNEL)


@pytest.mark.parametrize("partition_size", [0, 128])
def test_decode_bulk_graph_replay(partition_size):
    """The CUDA-graph replay test of test_cuda_graph.py on the Hopper kernel."""
    test_cuda_graph.test_decode_graph_replay("nhd", partition_size, KERNEL)
