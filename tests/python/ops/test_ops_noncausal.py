"""Non-causal (encoder) prefill attention on the CPU against the float64 reference: every query
token of a sequence sees all of the sequence's keys (its cached context and every new token,
later ones included), with alibi / soft-cap / GQA / both cache layouts / every dtype."""

from __future__ import annotations

import numpy as np
import pytest
from pagedkv import PagedAttention, ops
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import alibi, make_paged_kv, rand_array, to_fw, to_np, tolerance

torch = need("torch")

FRAMEWORKS_DTYPES = [
    ("numpy", "float32"),
    ("torch", "float32"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
]


def _case(seed: int) -> None:
    rng = np.random.default_rng(seed)
    fw, dtype = FRAMEWORKS_DTYPES[rng.integers(len(FRAMEWORKS_DTYPES))]
    layout = ("vllm", "nhd")[rng.integers(2)]
    d = int(rng.choice(ops.SUPPORTED_HEAD_SIZES))
    bs = int(rng.choice([8, 16, 32]))
    kvh = int(rng.choice([1, 2]))
    group = int(rng.choice([1, 3, 4]))
    h = kvh * group
    n = int(rng.integers(1, 4))
    # Mostly whole sequences (the encoder case), sometimes a cached context before them.
    ctx = [int(rng.choice([0, 0, rng.integers(1, 150)])) for _ in range(n)]
    qlen = [int(rng.integers(1, 130)) for _ in range(n)]
    kv = make_paged_kv(rng, fw, dtype, layout, "auto", ctx, bs, kvh, d)
    t = sum(qlen)
    query, q64 = rand_array(rng, (t, h, d), fw, dtype)
    key, k64 = rand_array(rng, (t, kvh, d), fw, dtype)
    value, v64 = rand_array(rng, (t, kvh, d), fw, dtype)
    qsl = np.concatenate([[0], np.cumsum(qlen)])
    seq = np.array(ctx) + np.array(qlen)
    cap = float(rng.uniform(5, 30)) if rng.random() < 0.3 else 0.0
    slopes, slopes64 = alibi(rng, h, fw) if rng.random() < 0.3 else (None, None)
    scale = float(rng.uniform(0.05, 0.2))
    out = PagedAttention.forward_prefix(
        query,
        key,
        value,
        "auto",
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        to_fw(qsl, fw, "int32"),
        to_fw(seq, fw, "int32"),
        max(qlen),
        slopes,
        None,
        1.0,
        1.0,
        scale=scale,
        logits_soft_cap=cap,
        causal=False,
    )
    got = to_np(out)
    assert not np.isnan(got).any()
    kw = dict(alibi_slopes=slopes64, soft_cap=cap)
    args = (q64, k64, v64, kv.k_dense, kv.v_dense, kv.block_tables_np, qsl, seq, scale)
    want = ref.prefix_prefill(*args, causal=False, **kw)
    err = ref.rel_error(got, want)
    assert err < tolerance(dtype), (err, fw, dtype, layout, d, bs, kvh, group, ctx, qlen)
    # The first new token of a sequence with later tokens must see them: a causal result differs.
    causal = ref.prefix_prefill(*args, **kw)
    multi = [i for i in range(n) if qlen[i] > 1]
    if multi:
        a = int(qsl[multi[0]])
        assert ref.rel_error(got[a], causal[a]) > 10 * tolerance(dtype)


@pytest.mark.parametrize("seed", range(16))
def test_noncausal_prefill_random(seed: int) -> None:
    _case(7000 + seed)


def _tiny_call(**kw):
    rng = np.random.default_rng(0)
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", [0], 16, 1, 32)
    q = torch.randn(3, 2, 32)
    k = torch.randn(3, 1, 32)
    qsl = torch.tensor([0, 3], dtype=torch.int32)
    sl = torch.tensor([3], dtype=torch.int32)
    return PagedAttention.forward_prefix(
        q, k, k.clone(), "auto", kv.key_cache, kv.value_cache, kv.block_tables, qsl, sl, 3,
        None, kw.pop("sliding_window", None), 1.0, 1.0, **kw,
    )  # fmt: skip


def test_noncausal_refuses_a_sliding_window_and_non_bool_flags() -> None:
    with pytest.raises(ValueError, match="sliding_window .*causal"):
        _tiny_call(sliding_window=2, causal=False)
    with pytest.raises(TypeError, match="causal must be a bool"):
        _tiny_call(causal=0)
    assert _tiny_call(sliding_window=2, causal=True).shape == (3, 2, 32)


def test_attention_spec_causal_flag() -> None:
    from pagedkv.models.attention_backend import AttentionSpec

    assert AttentionSpec(scale=1.0).causal
    with pytest.raises(ValueError, match="sliding_window needs causal"):
        AttentionSpec(scale=1.0, sliding_window=4, causal=False)
