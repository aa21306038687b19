"""Non-causal (encoder) prefill on each CUDA kernel, named so that it is required (a silent
fallback to another kernel fails): every query token sees all of its sequence's keys. Random
ragged sequences long enough for several query and key tiles per sequence (a cached context
sometimes), GQA, alibi / soft-cap (the kernels' general masking path) or none (their plain and
position-masked paths), against the float64 reference; NaN-poisoned outputs and unused cache
slots, and the CPU op on the same arrays must agree."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import alibi, make_paged_kv, rand_array, to_fw, to_np

torch = need("torch")

from pagedkv import ops  # noqa: E402

pytestmark = pytest.mark.cuda
TOL = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}

# kernel -> (dtypes, head sizes, layouts) it covers
KERNELS = {
    "hopper": (["float16", "bfloat16"], [64, 128], ["nhd"]),
    "tensor_core": (["float16", "bfloat16"], [32, 64, 80, 128, 256], ["nhd", "vllm"]),
    "cuda_core": (["float32", "float16", "bfloat16"], [32, 64, 96, 128, 256], ["nhd", "vllm"]),
}


def _case(kernel: str, seed: int, extras: bool) -> None:
    if kernel == "hopper" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wgmma prefill kernel needs a compute capability 9.x GPU")
    rng = np.random.default_rng(seed)
    dtypes, heads, layouts = KERNELS[kernel]
    dtype = str(rng.choice(dtypes))
    d = int(rng.choice(heads))
    layout = str(rng.choice(layouts))
    bs = int(rng.choice([16, 32]))
    kvh = int(rng.choice([1, 2]))
    group = int(rng.choice([1, 3, 4]))
    h = kvh * group
    n = int(rng.integers(1, 4))
    ctx = [int(rng.choice([0, 0, rng.integers(1, 300)])) for _ in range(n)]
    qlen = [int(rng.integers(1, 400)) for _ in range(n)]
    kv = make_paged_kv(rng, "torch", dtype, layout, "auto", ctx, bs, kvh, d, device="cuda")
    t = sum(qlen)
    q, q64 = rand_array(rng, (t, h, d), "torch", dtype, "cuda")
    k, k64 = rand_array(rng, (t, kvh, d), "torch", dtype, "cuda")
    v, v64 = rand_array(rng, (t, kvh, d), "torch", dtype, "cuda")
    qsl = np.concatenate([[0], np.cumsum(qlen)])
    seq = np.array(ctx) + np.array(qlen)
    cap = float(rng.uniform(5, 30)) if extras and rng.random() < 0.5 else 0.0
    use_alibi = extras and (cap == 0.0 or rng.random() < 0.5)
    slopes, slopes64 = alibi(rng, h, "torch", "cuda") if use_alibi else (None, None)
    scale = 1.0 / math.sqrt(d)

    def run(device: str):
        mv = (lambda x: x) if device == "cuda" else (lambda x: None if x is None else x.cpu())
        out = torch.full_like(mv(q), float("nan"))
        ops.context_attention_fwd(
            mv(q), mv(k), mv(v), out, "auto", mv(kv.key_cache), mv(kv.value_cache),
            mv(kv.block_tables), mv(to_fw(qsl, "torch", "int32", "cuda")),
            mv(to_fw(seq, "torch", "int32", "cuda")), None, max(qlen),
            alibi_slopes=mv(slopes), sm_scale=scale, logits_soft_cap=cap,
            kernel=kernel if device == "cuda" else "auto", causal=False,
        )  # fmt: skip
        return out

    got = run("cuda")
    torch.cuda.synchronize()
    got_np = to_np(got)
    assert not np.isnan(got_np).any(), "output element not written"
    want = ref.prefix_prefill(
        q64, k64, v64, kv.k_dense, kv.v_dense, kv.block_tables_np, qsl, seq, scale,
        alibi_slopes=slopes64, soft_cap=cap, causal=False,
    )  # fmt: skip
    err = ref.rel_error(got_np, want)
    info = (kernel, dtype, layout, d, bs, kvh, group, ctx, qlen, cap, use_alibi)
    assert err < TOL[dtype], (err, *info)
    assert ref.rel_error(got_np, to_np(run("cpu"))) < 2 * TOL[dtype], info


@pytest.mark.parametrize("extras", [False, True])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_noncausal_prefill_cuda(kernel: str, seed: int, extras: bool) -> None:
    _case(kernel, 9100 + seed * 2 + int(extras), extras)
