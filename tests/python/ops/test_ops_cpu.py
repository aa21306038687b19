"""CPU paged KV-cache ops against the float64 reference (support/reference_attention.py).

Each case draws fresh random data from its own seed. Outputs are poisoned with NaN before the
call, so an element the kernel forgot to write fails the check, and unused cache slots are
poisoned too, so reading past a sequence (or a padded block-table entry) fails as well.
"""

from __future__ import annotations

import math

import numpy as np
import pagedkv
import pytest
from pagedkv import PagedAttention, ops
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import (
    alibi,
    empty_like_fw,
    make_paged_kv,
    rand_array,
    run_paged_decode,
    to_fw,
    to_np,
    tolerance,
)

torch = need("torch")

HEAD_SIZES = PagedAttention.get_supported_head_sizes()
FRAMEWORKS_DTYPES = [
    ("numpy", "float32"),
    ("numpy", "float16"),
    ("torch", "float32"),
    ("torch", "float16"),
    ("torch", "bfloat16"),
]


def _decode_case(
    seed: int,
    *,
    version: int,
    max_len: int = 300,
    fp8: str = "auto",
    layout: str | None = None,
    fw_dtype: tuple | None = None,
    features: bool = True,
) -> None:
    rng = np.random.default_rng(seed)
    fw, dtype = fw_dtype or FRAMEWORKS_DTYPES[rng.integers(len(FRAMEWORKS_DTYPES))]
    layout = layout or ("vllm", "nhd")[rng.integers(2)]
    d = int(rng.choice(HEAD_SIZES))
    if fp8 != "auto" and layout == "vllm" and d % 16:
        d = 128  # the vLLM key layout needs head_size % x == 0 (x = 16 for fp8)
    bs = int(rng.choice([8, 16, 32]))
    kvh = int(rng.choice([1, 2, 3]))
    group = int(rng.choice([1, 3, 4, 8]))
    h = kvh * group
    s = int(rng.integers(1, 5))
    lens = [int(rng.integers(1, max_len + 1)) for _ in range(s)]
    k_scale, v_scale = (
        (1.0, 1.0)
        if fp8 == "auto"
        else (float(rng.uniform(0.02, 0.3)), float(rng.uniform(0.02, 0.3)))
    )
    kv = make_paged_kv(
        rng, fw, dtype, layout, fp8, lens, bs, kvh, d, k_scale=k_scale, v_scale=v_scale
    )
    query, q64 = rand_array(rng, (s, h, d), fw, dtype)
    scale = 1.0 / math.sqrt(d)
    use_alibi = features and rng.random() < 0.3
    cap = float(rng.uniform(5, 30)) if features and rng.random() < 0.3 else 0.0
    window = int(rng.integers(1, max_len)) if features and rng.random() < 0.3 else None
    slopes, slopes64 = alibi(rng, h, fw) if use_alibi else (None, None)
    seq_lens = to_fw(np.array(lens), fw, "int32")
    out = empty_like_fw((s, h, d), fw, dtype)
    max_len_arg = max(lens)
    parts = run_paged_decode(
        version,
        out,
        query,
        kv,
        kvh,
        scale,
        seq_lens,
        bs,
        max_len_arg,
        slopes,
        logits_soft_cap=cap,
        sliding_window=window,
    )
    if parts is not None:
        _check_partitions(*(to_np(a) for a in parts), to_np(out), lens)
    assert type(out) is type(query)
    got = to_np(out)
    assert not np.isnan(got).any(), "output element not written"
    want = ref.decode(
        q64,
        kv.k_dense,
        kv.v_dense,
        kv.block_tables_np,
        np.array(lens),
        scale,
        alibi_slopes=slopes64,
        soft_cap=cap,
        sliding_window=window,
    )
    err = ref.rel_error(got, want)
    assert err < tolerance(dtype), (err, fw, dtype, layout, d, bs, kvh, group, lens)


def _check_partitions(exp_sums, max_logits, tmp, out, lens) -> None:
    """vLLM's v2 contract: merging (exp_sums, max_logits, tmp_out) reproduces out."""
    for i, n in enumerate(lens):
        p = (n + 511) // 512
        m, e, t = max_logits[i, :, :p], exp_sums[i, :, :p], tmp[i, :, :p]
        assert np.isfinite(e).all() and not np.isnan(m).any() and np.isfinite(t).all()
        w = e * np.exp(np.where(np.isfinite(m), m - m.max(axis=1, keepdims=True), -np.inf))
        merged = (w[:, :, None] * t).sum(axis=1) / w.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(merged, out[i], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("seed", range(40))
def test_decode_v1_random(seed: int) -> None:
    _decode_case(1000 + seed, version=1)


@pytest.mark.parametrize("seed", range(16))
def test_decode_v2_random(seed: int) -> None:
    _decode_case(2000 + seed, version=2, max_len=1100)


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_decode_every_head_size(layout: str, head_size: int) -> None:
    rng = np.random.default_rng(head_size * 7 + len(layout))
    for fw, dtype in (("numpy", "float32"), ("torch", "bfloat16")):
        kv = make_paged_kv(rng, fw, dtype, layout, "auto", [37, 5], 16, 2, head_size)
        query, q64 = rand_array(rng, (2, 8, head_size), fw, dtype)
        seq_lens = to_fw(np.array([37, 5]), fw, "int32")
        out = PagedAttention.forward_decode(
            query,
            kv.key_cache,
            kv.value_cache,
            kv.block_tables,
            seq_lens,
            37,
            "auto",
            2,
            0.1,
            None,
            1.0,
            1.0,
        )
        want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array([37, 5]), 0.1)
        assert ref.rel_error(to_np(out), want) < tolerance(dtype)


@pytest.mark.parametrize("fp8", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("seed", range(4))
def test_decode_fp8(fp8: str, seed: int) -> None:
    _decode_case(3000 + seed * 3 + len(fp8), version=1 + seed % 2, max_len=700, fp8=fp8)


def _prefill_case(seed: int, *, fp8: str = "auto", features: bool = True) -> None:
    rng = np.random.default_rng(seed)
    fw, dtype = FRAMEWORKS_DTYPES[rng.integers(len(FRAMEWORKS_DTYPES))]
    layout = ("vllm", "nhd")[rng.integers(2)]
    d = int(rng.choice(HEAD_SIZES))
    if fp8 != "auto" and layout == "vllm" and d % 16:
        d = 64
    bs = int(rng.choice([8, 16, 32]))
    kvh = int(rng.choice([1, 2]))
    group = int(rng.choice([1, 3, 4, 8]))
    h = kvh * group
    n = int(rng.integers(1, 4))
    ctx = [int(rng.choice([0, rng.integers(1, 200)])) for _ in range(n)]
    qlen = [int(rng.integers(1, 90)) for _ in range(n)]
    k_scale, v_scale = (1.0, 1.0) if fp8 == "auto" else (0.1, 0.05)
    kv = make_paged_kv(
        rng, fw, dtype, layout, fp8, ctx, bs, kvh, d, k_scale=k_scale, v_scale=v_scale
    )
    t = sum(qlen)
    query, q64 = rand_array(rng, (t, h, d), fw, dtype)
    key, k64 = rand_array(rng, (t, kvh, d), fw, dtype)
    value, v64 = rand_array(rng, (t, kvh, d), fw, dtype)
    qsl = np.concatenate([[0], np.cumsum(qlen)])
    seq = np.array(ctx) + np.array(qlen)
    use_alibi = features and rng.random() < 0.3
    cap = float(rng.uniform(5, 30)) if features and rng.random() < 0.3 else 0.0
    window = int(rng.integers(1, 150)) if features and rng.random() < 0.3 else None
    slopes, slopes64 = alibi(rng, h, fw) if use_alibi else (None, None)
    scale = float(rng.uniform(0.05, 0.2))
    out = PagedAttention.forward_prefix(
        query,
        key,
        value,
        fp8,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        to_fw(qsl, fw, "int32"),
        to_fw(seq, fw, "int32"),
        max(qlen),
        slopes,
        window,
        k_scale,
        v_scale,
        scale=scale,
        logits_soft_cap=cap,
    )
    assert type(out) is type(query)
    got = to_np(out)
    assert not np.isnan(got).any()
    want = ref.prefix_prefill(
        q64,
        k64,
        v64,
        kv.k_dense,
        kv.v_dense,
        kv.block_tables_np,
        qsl,
        seq,
        scale,
        alibi_slopes=slopes64,
        soft_cap=cap,
        sliding_window=window,
    )
    err = ref.rel_error(got, want)
    assert err < tolerance(dtype), (err, fw, dtype, layout, d, bs, kvh, group, ctx, qlen)


@pytest.mark.parametrize("seed", range(30))
def test_prefix_prefill_random(seed: int) -> None:
    _prefill_case(4000 + seed)


@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_prefix_prefill_fp8(fp8: str) -> None:
    for seed in range(3):
        _prefill_case(5000 + seed + len(fp8), fp8=fp8)


def _write_case(seed: int, layout: str, fp8: str) -> None:
    rng = np.random.default_rng(seed)
    fw, dtype = FRAMEWORKS_DTYPES[rng.integers(len(FRAMEWORKS_DTYPES))]
    d = int(rng.choice(HEAD_SIZES if fp8 == "auto" or layout == "nhd" else [64, 128, 256]))
    bs, kvh, nb, t = int(rng.choice([8, 16, 32])), int(rng.integers(1, 4)), 7, 40
    key, k64 = rand_array(rng, (t, kvh, d), fw, dtype, scale=3.0)
    value, v64 = rand_array(rng, (t, kvh, d), fw, dtype, scale=3.0)
    slots = rng.choice(nb * bs, size=t, replace=False).astype(np.int64)
    slots[rng.random(t) < 0.2] = -1  # padding tokens: skipped
    store = dtype if fp8 == "auto" else "uint8"
    x = 16 // (1 if fp8 != "auto" else 4 if dtype == "float32" else 2)
    if layout == "vllm":
        kshape, vshape = (nb, kvh, d // x, bs, x), (nb, kvh, d, bs)
    else:
        kshape = vshape = (nb, bs, kvh, d)
    fill = 0 if fp8 != "auto" else -7.0  # sentinel for slots that must stay untouched
    kc, vc = to_fw(np.full(kshape, fill), fw, store), to_fw(np.full(vshape, fill), fw, store)
    k_scale, v_scale = (1.0, 1.0) if fp8 == "auto" else (0.5, 2.0)
    fn = ops.reshape_and_cache if layout == "vllm" else ops.reshape_and_cache_flash
    fn(key, value, kc, vc, to_fw(slots, fw, "int64"), fp8, k_scale, v_scale)
    for cache, src, is_key, sc in ((kc, k64, True, k_scale), (vc, v64, False, v_scale)):
        raw = to_np(cache)
        if fp8 == "auto":
            dense = ref.dense_cache(raw, is_key, layout).reshape(nb * bs, kvh, d)
            want = np.full_like(dense, fill)
            want[slots[slots >= 0]] = src[slots >= 0]
            np.testing.assert_array_equal(dense, want)  # bit-exact copy
        else:
            fmt = ref.fp8_format(fp8)
            codes = ref.dense_cache(raw.astype(np.float64), is_key, layout)
            codes = codes.reshape(nb * bs, kvh, d).astype(np.uint8)
            want = np.zeros_like(codes)
            want[slots[slots >= 0]] = ref.fp8_encode(src[slots >= 0] / sc, fmt)
            np.testing.assert_array_equal(codes, want)  # same rounding and saturation


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("fp8", ["auto", "fp8_e4m3", "fp8_e5m2"])
def test_reshape_and_cache(layout: str, fp8: str) -> None:
    for seed in range(3):
        _write_case(6000 + seed * 10 + len(fp8) + len(layout), layout, fp8)


def test_fp8_roundtrip_error_bounds() -> None:
    rng = np.random.default_rng(7)
    for fmt, mbits, maxv in (("fp8_e4m3", 3, 448.0), ("fp8_e5m2", 2, 57344.0)):
        vals = np.concatenate(
            [
                rng.standard_normal(4026) * 10.0 ** rng.integers(-3, 3, 4026),
                [maxv * 1.5, -maxv * 3, 0.0, -0.0, 1e-9, maxv],
            ]
        )
        key = vals.reshape(-1, 1, 32).astype(np.float32)
        kc = np.zeros((key.shape[0], 1, 1, 32), np.uint8)
        ops.reshape_and_cache_flash(key, key, kc, kc.copy(), np.arange(key.shape[0]), fmt, 1.0, 1.0)
        back = ref.fp8_decode(kc.reshape(-1), ref.fp8_format(fmt))
        x = key.reshape(-1).astype(np.float64)
        normal_min = 2.0 ** (1 - (7 if mbits == 3 else 15))
        big = (np.abs(x) >= normal_min) & (np.abs(x) <= maxv)
        rel = np.abs(back[big] - x[big]) / np.abs(x[big])
        assert rel.max() <= 2.0 ** -(mbits + 1) + 1e-12  # half an ulp
        assert np.all(np.abs(back[np.abs(x) > maxv]) == maxv)  # saturated
        assert np.all(np.sign(back[x != 0]) * np.sign(x[x != 0]) >= 0)
        if fmt == "fp8_e4m3" and hasattr(torch, "float8_e4m3fn"):
            inr = np.abs(x) <= maxv
            t = torch.from_numpy(x[inr].astype(np.float32)).to(torch.float8_e4m3fn)
            np.testing.assert_array_equal(t.view(torch.uint8).numpy(), kc.reshape(-1)[inr])


def test_copy_and_swap_blocks() -> None:
    rng = np.random.default_rng(11)
    shape = (2, 10, 16 * 2 * 64)
    kv_caches = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    before = [c.copy() for c in kv_caches]
    mapping = np.array([[0, 5], [3, 7], [9, 1]], np.int64)
    PagedAttention.copy_blocks(kv_caches, mapping)
    for c, b in zip(kv_caches, before):
        want = b.copy()
        want[:, mapping[:, 1]] = b[:, mapping[:, 0]]
        np.testing.assert_array_equal(c, want)
    src = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    dst = torch.zeros(2, 4, shape[2])
    PagedAttention.swap_blocks(src, dst, torch.tensor([[2, 0], [8, 3]]))
    assert torch.equal(dst[:, 0], src[:, 2]) and torch.equal(dst[:, 3], src[:, 8])
    assert torch.count_nonzero(dst[:, 1:3]) == 0


def test_split_kv_cache_and_write_then_decode() -> None:
    """The seed-001 flow: allocate, split, write tokens, decode; numpy and torch alike."""
    rng = np.random.default_rng(5)
    nb, bs, kvh, d, h = 6, 16, 3, 64, 9
    for fw in ("numpy", "torch"):
        shape = PagedAttention.get_kv_cache_shape(nb, bs, kvh, d)
        kv = to_fw(np.zeros(shape), fw, "float32")
        kc, vc = PagedAttention.split_kv_cache(kv, kvh, d)
        assert tuple(kc.shape) == (nb, kvh, d // 4, bs, 4) and tuple(vc.shape) == (nb, kvh, d, bs)
        n = 21
        key, k64 = rand_array(rng, (n, kvh, d), fw, "float32")
        value, v64 = rand_array(rng, (n, kvh, d), fw, "float32")
        table = np.array([[4, 1]], np.int32)
        slots = np.array([table[0, i // bs] * bs + i % bs for i in range(n)], np.int64)
        PagedAttention.write_to_paged_cache(
            key, value, kc, vc, to_fw(slots, fw, "int64"), "auto", 1.0, 1.0
        )
        q, q64 = rand_array(rng, (1, h, d), fw, "float32")
        out = PagedAttention.forward_decode(
            q,
            kc,
            vc,
            to_fw(table, fw, "int32"),
            to_fw(np.array([n]), fw, "int32"),
            n,
            "auto",
            kvh,
            0.125,
            None,
            1.0,
            1.0,
        )
        want = ref.attention(q64, k64, v64, np.array([n - 1]), 0.125)
        assert ref.rel_error(to_np(out), want) < 2e-6


def test_scales_as_arrays_and_streams() -> None:
    rng = np.random.default_rng(3)
    kv = make_paged_kv(
        rng, "torch", "float32", "nhd", "fp8_e4m3", [50], 16, 1, 32, k_scale=0.25, v_scale=0.5
    )
    q, q64 = rand_array(rng, (1, 2, 32), "torch", "float32")
    out = PagedAttention.forward_decode(
        q,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        torch.tensor([50], dtype=torch.int32),
        50,
        "fp8",
        1,
        0.2,
        None,
        torch.tensor([0.25]),
        torch.tensor(0.5),
    )
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array([50]), 0.2)
    assert ref.rel_error(to_np(out), want) < 2e-6


def test_seed000_decode_shapes() -> None:
    """Seed 000's opt-125m decode call: 12 heads of 64, block 16, 13-block table, len 204."""
    rng = np.random.default_rng(0)
    kv = make_paged_kv(
        rng, "torch", "float16", "vllm", "auto", [204], 16, 12, 64, spare_blocks=40, table_pad=0
    )
    assert tuple(kv.key_cache.shape[1:]) == (12, 8, 16, 8)
    assert kv.block_tables.shape == (1, 13)
    q, q64 = rand_array(rng, (1, 12, 64), "torch", "float16")
    out = PagedAttention.forward_decode(
        q,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        torch.tensor([204], dtype=torch.int32),
        204,
        "auto",
        12,
        0.125,
        None,
        1.0,
        1.0,
    )
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array([204]), 0.125)
    assert out.dtype == torch.float16 and ref.rel_error(to_np(out), want) < 1e-2


def test_threads_reported() -> None:
    assert pagedkv._C.ops_num_threads() >= 1


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_decode_matrix(layout: str, block_size: int, group: int) -> None:
    """Every layout x block size x GQA ratio, v1 and v2 (with lengths past two partitions)."""
    rng = np.random.default_rng(block_size * 100 + group * 10 + len(layout))
    fw, dtype = FRAMEWORKS_DTYPES[rng.integers(len(FRAMEWORKS_DTYPES))]
    d = int(rng.choice(HEAD_SIZES))
    kvh = int(rng.integers(1, 3))
    lens = [int(rng.integers(1, 1100)), 1, int(rng.integers(500, 1100))]
    kv = make_paged_kv(rng, fw, dtype, layout, "auto", lens, block_size, kvh, d)
    query, q64 = rand_array(rng, (3, kvh * group, d), fw, dtype)
    seq_lens = to_fw(np.array(lens), fw, "int32")
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array(lens), 0.09)
    for version in (1, 2):
        out = empty_like_fw(query.shape, fw, dtype)
        # v2's tmp_out in the query dtype: accepted as well as float32.
        run_paged_decode(
            version, out, query, kv, kvh, 0.09, seq_lens, block_size, max(lens), tmp_dtype=dtype
        )
        got = to_np(out)
        assert not np.isnan(got).any()
        assert ref.rel_error(got, want) < tolerance(dtype), (version, fw, dtype, d, kvh, lens)


def test_decode_strided_query_out_and_small_partitions() -> None:
    """query/out as column slices of wider tensors (vLLM slices q out of qkv), v2 with a
    partition of 32 keys and a sliding window that hides whole partitions."""
    rng = np.random.default_rng(21)
    kvh, group, d, lens = 2, 4, 64, [300, 77, 5]
    kv = make_paged_kv(rng, "torch", "float32", "nhd", "auto", lens, 16, kvh, d)
    qkv = torch.randn(3, kvh * group + 2 * kvh, d)
    query = qkv[:, : kvh * group]
    assert not query.is_contiguous()
    big_out = torch.full((3, 16, d), float("nan"))
    out = big_out[:, 2 : 2 + kvh * group]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q64 = query.double().numpy()
    for window in (None, 40):
        want = ref.decode(
            q64,
            kv.k_dense,
            kv.v_dense,
            kv.block_tables_np,
            np.array(lens),
            0.1,
            sliding_window=window,
        )
        ops.paged_attention_v1(
            out,
            query,
            kv.key_cache,
            kv.value_cache,
            kvh,
            0.1,
            kv.block_tables,
            seq_lens,
            16,
            300,
            sliding_window=window,
        )
        assert ref.rel_error(out.double().numpy(), want) < 2e-6
        p = (300 + 31) // 32
        es = torch.full((3, kvh * group, p), float("nan"))
        ml, tmp = es.clone(), torch.full((3, kvh * group, p, d), float("nan"))
        out.fill_(float("nan"))
        ops.paged_attention_v2(
            out,
            es,
            ml,
            tmp,
            query,
            kv.key_cache,
            kv.value_cache,
            kvh,
            0.1,
            kv.block_tables,
            seq_lens,
            16,
            300,
            sliding_window=window,
            partition_size=32,
        )
        assert ref.rel_error(out.double().numpy(), want) < 2e-6
        assert torch.isnan(big_out[:, :2]).all() and torch.isnan(big_out[:, 10:]).all()


def test_decode_empty_sequence_gives_zeros() -> None:
    rng = np.random.default_rng(9)
    kv = make_paged_kv(rng, "numpy", "float32", "vllm", "auto", [0, 20], 16, 1, 32)
    q, q64 = rand_array(rng, (2, 2, 32), "numpy", "float32")
    out = PagedAttention.forward_decode(
        q,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        np.array([0, 20], np.int32),
        20,
        "auto",
        1,
        0.2,
        None,
        1.0,
        1.0,
    )
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert np.all(out[0] == 0)
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array([0, 20]), 0.2)
    assert ref.rel_error(out, want) < 2e-6


@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_seed000_chunked_prefill_then_decode(layout: str) -> None:
    """Seed 000's schedule for one 484-token prompt: a 28-token chunk, then the remaining 456
    tokens over the cached 28, then a decode step. Each step writes its tokens to the cache
    first (as the model runner does) and must match one-shot attention over the prompt."""
    rng = np.random.default_rng(484)
    h, kvh, d, bs, n = 9, 3, 64, 16, 485
    q_all = torch.randn(n, h, d)
    k_all = torch.randn(n, kvh, d)
    v_all = torch.randn(n, kvh, d)
    nb = 40
    shape = PagedAttention.get_kv_cache_shape(nb, bs, kvh, d)
    kv_cache = torch.zeros(shape)
    if layout == "vllm":
        kc, vc = PagedAttention.split_kv_cache(kv_cache, kvh, d)
    else:
        kc = torch.zeros(nb, bs, kvh, d)
        vc = torch.zeros(nb, bs, kvh, d)
    table = torch.from_numpy(rng.permutation(nb)[: (n + bs - 1) // bs].astype(np.int32))[None]
    slots = table[0].long()[torch.arange(n) // bs] * bs + torch.arange(n) % bs
    write = ops.reshape_and_cache if layout == "vllm" else ops.reshape_and_cache_flash
    outs = []
    for start, end in ((0, 28), (28, 484)):
        write(k_all[start:end], v_all[start:end], kc, vc, slots[start:end])
        outs.append(
            PagedAttention.forward_prefix(
                q_all[start:end],
                k_all[start:end],
                v_all[start:end],
                "auto",
                kc,
                vc,
                table,
                torch.tensor([0, end - start], dtype=torch.int32),
                torch.tensor([end], dtype=torch.int32),
                end - start,
                None,
                None,
                1.0,
                1.0,
            )
        )
    write(k_all[484:], v_all[484:], kc, vc, slots[484:])
    outs.append(
        PagedAttention.forward_decode(
            q_all[484:],
            kc,
            vc,
            table,
            torch.tensor([485], dtype=torch.int32),
            485,
            "auto",
            kvh,
            1 / 8,
            None,
            1.0,
            1.0,
        )
    )
    got = torch.cat(outs).double().numpy()
    want = ref.attention(
        q_all.double().numpy(), k_all.double().numpy(), v_all.double().numpy(), np.arange(n), 1 / 8
    )
    assert ref.rel_error(got, want) < 2e-6


def test_concurrent_calls_and_forked_child() -> None:
    """Ops called from several Python threads at once (the GIL is released) and from a forked
    child (whose copy of the thread pool has no workers) still give the right answers."""
    import os
    import threading

    rng = np.random.default_rng(33)
    kv = make_paged_kv(rng, "numpy", "float32", "nhd", "auto", [700, 300], 16, 2, 64)
    q, q64 = rand_array(rng, (2, 8, 64), "numpy", "float32")
    lens = np.array([700, 300], np.int32)
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, lens, 0.1)

    def run() -> np.ndarray:
        return PagedAttention.forward_decode(
            q,
            kv.key_cache,
            kv.value_cache,
            kv.block_tables,
            lens,
            700,
            "auto",
            2,
            0.1,
            None,
            1.0,
            1.0,
        )

    run()  # start the pool before forking
    errors: list[float] = []
    threads = [
        threading.Thread(target=lambda: errors.extend(ref.rel_error(run(), want) for _ in range(5)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(errors) == 20 and max(errors) < 2e-6
    pid = os.fork()
    if pid == 0:  # child: exit code says whether the result was right
        os._exit(0 if ref.rel_error(run(), want) < 2e-6 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
