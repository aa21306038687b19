"""fp8 scales given as arrays (vLLM passes k_scale / v_scale tensors) are handed to the kernels,
which read them themselves, against the float64 reference; PagedAttention.write_to_paged_cache
takes both cache layouts. CPU here (host arrays: the same C++ path as device arrays up to where
the value is read); the CUDA twin is tests/python/kernels/test_scale_arrays_cuda.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pagedkv import PagedAttention
from support import reference_attention as ref
from support.deps import need
from support.paged_cases import make_paged_kv, rand_array, to_fw, to_np

torch = need("torch")

# How a scale is given: a number, a [1] numpy float32 array, a 0-d torch float32 tensor, a [1]
# float64 torch tensor (read on the host), all worth the same value.
FORMS = {
    "number": float,
    "numpy[1]": lambda v: np.array([v], np.float32),
    "torch0d": lambda v: torch.tensor(v, dtype=torch.float32),
    "torch64": lambda v: torch.tensor([v], dtype=torch.float64),
}
SCALES = (0.375, 1.5)  # exact in float32: the forms agree bit for bit


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
@pytest.mark.parametrize("fp8", ["fp8_e4m3", "fp8_e5m2"])
def test_cache_write(fp8: str, layout: str, form: str) -> None:
    """write_to_paged_cache stores value / scale, rounded like the float64 reference, into a
    cache of either layout (vLLM 5-D, NHD 4-D)."""
    rng = np.random.default_rng(11)
    nb, bs, kvh, d, t = 4, 16, 2, 64, 20
    key, k64 = rand_array(rng, (t, kvh, d), "torch", "float16", scale=3.0)
    value, v64 = rand_array(rng, (t, kvh, d), "torch", "float16", scale=3.0)
    slots = rng.choice(nb * bs, size=t, replace=False).astype(np.int64)
    shapes = (
        ((nb, kvh, d // 16, bs, 16), (nb, kvh, d, bs))
        if layout == "vllm"
        else ((nb, bs, kvh, d), (nb, bs, kvh, d))
    )
    kc, vc = (torch.zeros(s, dtype=torch.uint8) for s in shapes)
    ks, vs = (FORMS[form](v) for v in SCALES)
    PagedAttention.write_to_paged_cache(key, value, kc, vc, torch.from_numpy(slots), fp8, ks, vs)
    fmt = ref.fp8_format(fp8)
    for cache, src, is_key, sc in ((kc, k64, True, SCALES[0]), (vc, v64, False, SCALES[1])):
        codes = ref.dense_cache(to_np(cache).astype(np.float64), is_key, layout)
        codes = codes.reshape(nb * bs, kvh, d).astype(np.uint8)
        want = np.zeros_like(codes)
        want[slots] = ref.fp8_encode(src / sc, fmt)
        np.testing.assert_array_equal(codes, want)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_decode_and_prefill(layout: str, form: str) -> None:
    """forward_decode and forward_prefix read array scales like numbers: equal outputs, and
    within tolerance of the float64 reference over the dequantised cache."""
    rng = np.random.default_rng(5)
    kvh, group, d, bs, fp8 = 2, 4, 64, 16, "fp8_e4m3"
    lens = [37, 90]
    kv = make_paged_kv(
        rng, "torch", "float32", layout, fp8, lens, bs, kvh, d, k_scale=SCALES[0], v_scale=SCALES[1]
    )
    query, q64 = rand_array(rng, (len(lens), kvh * group, d), "torch", "float32")
    sl = to_fw(np.array(lens), "torch", "int32")
    scale = 1.0 / math.sqrt(d)
    ks, vs = (FORMS[form](v) for v in SCALES)

    def decode(k_scale, v_scale):
        return PagedAttention.forward_decode(
            query,
            kv.key_cache,
            kv.value_cache,
            kv.block_tables,
            sl,
            max(lens),
            fp8,
            kvh,
            scale,
            None,
            k_scale,
            v_scale,
        )

    got = decode(ks, vs)
    assert torch.equal(got, decode(*SCALES))
    want = ref.decode(q64, kv.k_dense, kv.v_dense, kv.block_tables_np, np.array(lens), scale)
    assert ref.rel_error(to_np(got), want) < 2e-6

    new = [5, 9]  # the last tokens of each sequence are new, the rest cached
    qsl = np.array([0, new[0], sum(new)], np.int32)
    q, qn64 = rand_array(rng, (sum(new), kvh * group, d), "torch", "float32")
    k, kn64 = rand_array(rng, (sum(new), kvh, d), "torch", "float32")
    v, vn64 = rand_array(rng, (sum(new), kvh, d), "torch", "float32")

    def prefill(k_scale, v_scale):
        return PagedAttention.forward_prefix(
            q,
            k,
            v,
            fp8,
            kv.key_cache,
            kv.value_cache,
            kv.block_tables,
            torch.from_numpy(qsl),
            sl,
            max(new),
            None,
            None,
            k_scale,
            v_scale,
        )

    got = prefill(ks, vs)
    assert torch.equal(got, prefill(*SCALES))
    want = ref.prefix_prefill(
        qn64, kn64, vn64, kv.k_dense, kv.v_dense, kv.block_tables_np, qsl, np.array(lens), scale
    )
    assert ref.rel_error(to_np(got), want) < 2e-6


def test_scale_errors() -> None:
    """Arrays are refused by name where a number would be: wrong size, a non-positive host
    value (checked like a number), a dtype that is not a float."""
    q = torch.zeros(1, 4, 64)
    kc = torch.zeros(2, 16, 2, 64, dtype=torch.uint8)
    args = (
        q,
        kc,
        kc,
        torch.zeros(1, 2, dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32),
        3,
        "fp8",
        2,
        0.125,
        None,
    )
    with pytest.raises(ValueError, match="k_scale must be a number or a 1-element array"):
        PagedAttention.forward_decode(*args, torch.ones(2), 1.0)
    with pytest.raises(ValueError, match="v_scale must be a positive finite number"):
        PagedAttention.forward_decode(*args, 1.0, torch.zeros(1))
    with pytest.raises(TypeError, match="k_scale must be a number or a 1-element array"):
        PagedAttention.forward_decode(*args, "1.0", 1.0)


def test_float32_tensor_scales_are_never_read_on_the_host(monkeypatch) -> None:
    """Seed-001 fidelity: k_scale / v_scale given as float32 tensors (what vLLM passes) reach the
    kernels as arrays; nothing reads their value on the host (no .item(), no .tolist(), no
    float()): on a GPU that would be a sync per call and break graph capture. The cache write
    and both attention front ends, with every host read of a tensor made to fail."""

    def no_host_read(*_a, **_k):
        raise AssertionError("a scale tensor was read on the host")

    rng = np.random.default_rng(9)
    kvh, d, bs, fp8, lens = 2, 64, 16, "fp8_e4m3", [20, 33]
    kv = make_paged_kv(rng, "torch", "float32", "nhd", fp8, lens, bs, kvh, d)
    query, _ = rand_array(rng, (2, kvh * 2, d), "torch", "float32")
    key, _ = rand_array(rng, (3, kvh, d), "torch", "float32")
    sl = to_fw(np.array(lens), "torch", "int32")
    ks, vs = (torch.tensor([v], dtype=torch.float32) for v in SCALES)
    for name in ("item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, no_host_read)
    slots = torch.tensor([1, 17, 40], dtype=torch.int64)
    PagedAttention.write_to_paged_cache(key, key, kv.key_cache, kv.value_cache, slots, fp8, ks, vs)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, sl, max(lens), fp8, kvh)
    PagedAttention.forward_decode(*args, 0.125, None, ks, vs)
    qsl = torch.tensor([0, 1, 3], dtype=torch.int32)
    PagedAttention.forward_prefix(
        key.repeat(1, 2, 1),
        key,
        key,
        fp8,
        kv.key_cache,
        kv.value_cache,
        kv.block_tables,
        qsl,
        sl,
        2,
        None,
        None,
        ks,
        vs,
    )
