"""Outputs that share memory with inputs, or repeat their own elements, are refused by name.

Before, prefill attention writing into a view of its own keys (num_heads == num_kv_heads) was
silently wrong from the second query tile on, and writable expanded torch views (stride 0) as
`out`, a cache or `dst` had every row / block alias one another.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from pagedkv import ops
from support import reference_attention as ref

F32 = np.float32


def prefill_case(tokens: int = 300) -> dict[str, Any]:
    """One sequence of `tokens` new tokens over a 5-token cached prefix, MHA (2 heads)."""
    rng = np.random.default_rng(0)
    h, d = 2, 64
    return dict(
        q=rng.standard_normal((tokens, h, d)).astype(F32),
        k=rng.standard_normal((tokens, h, d)).astype(F32),
        v=rng.standard_normal((tokens, h, d)).astype(F32),
        o=np.zeros((tokens, h, d), F32),
        kv_cache_dtype="auto",
        k_cache=rng.standard_normal((64, 16, h, d)).astype(F32),
        v_cache=rng.standard_normal((64, 16, h, d)).astype(F32),
        b_loc=np.array([[0, 1]], np.int32),
        b_start_loc=np.array([0, tokens], np.int32),
        b_seq_len=np.array([tokens + 5], np.int32),
        max_seq_len=None,
        max_input_len=tokens,
        sm_scale=0.125,
    )


def prefill_reference(a: dict[str, Any]) -> np.ndarray:
    kd = ref.dense_cache(a["k_cache"], True, "nhd")
    vd = ref.dense_cache(a["v_cache"], False, "nhd")
    return ref.prefix_prefill(
        a["q"].astype(np.float64),
        a["k"].astype(np.float64),
        a["v"].astype(np.float64),
        kd,
        vd,
        a["b_loc"],
        a["b_start_loc"],
        a["b_seq_len"],
        0.125,
    )


def test_separate_output_is_right() -> None:
    a = prefill_case()
    ops.context_attention_fwd(**a)
    assert ref.rel_error(a["o"], prefill_reference(a)) < 1e-5


@pytest.mark.parametrize("alias", ["q", "k", "v"])
def test_prefill_output_aliasing_an_input_is_refused(alias: str) -> None:
    a = prefill_case()
    expected = prefill_reference(a)
    a["o"] = a[alias]
    name = {"q": "query", "k": "key", "v": "value"}[alias]
    with pytest.raises(ValueError, match=f"out overlaps {name} in memory"):
        ops.context_attention_fwd(**a)
    # Nothing was written: the input is intact and a separate output still gives the answer.
    a["o"] = np.zeros_like(a["q"])
    ops.context_attention_fwd(**a)
    assert ref.rel_error(a["o"], expected) < 1e-5


def test_output_overlapping_part_of_an_input_is_refused() -> None:
    a = prefill_case(64)
    buf = np.zeros((65, 2, 64), F32)
    buf[1:] = a["k"]
    a["k"], a["o"] = buf[1:], buf[:64]  # shifted by one token
    with pytest.raises(ValueError, match="out overlaps key"):
        ops.context_attention_fwd(**a)


def decode_case() -> dict[str, Any]:
    rng = np.random.default_rng(1)
    return dict(
        out=torch.zeros(2, 8, 64),
        query=torch.randn(2, 8, 64),
        key_cache=torch.randn(6, 16, 2, 64),
        value_cache=torch.randn(6, 16, 2, 64),
        num_kv_heads=2,
        scale=0.125,
        block_tables=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32),
        seq_lens=torch.tensor([40, 20], dtype=torch.int32),
        block_size=16,
        max_seq_len=40,
        alibi_slopes=torch.from_numpy(rng.uniform(0.1, 0.5, 8).astype(F32)),
    )


def test_decode_in_place_on_the_query_is_refused() -> None:
    a = decode_case()
    a["out"] = a["query"]
    with pytest.raises(ValueError, match="out overlaps query"):
        ops.paged_attention_v1(**a)


def test_expanded_decode_output_is_refused() -> None:
    a = decode_case()
    a["out"] = torch.zeros(1, 8, 64).expand(2, 8, 64)
    with pytest.raises(
        ValueError,
        match=r"out \(shape \[2, 8, 64\], strides \[0, 64, 1\]\) "
        r"repeats elements",
    ):
        ops.paged_attention_v1(**a)


def test_v2_partials_must_not_overlap() -> None:
    a = decode_case()
    parts = 3
    tmp = torch.zeros(2, 8, parts, 64)
    exp_sums = torch.zeros(2, 8, parts)
    with pytest.raises(ValueError, match="exp_sums overlaps max_logits"):
        ops.paged_attention_v2(
            exp_sums=exp_sums, max_logits=exp_sums, tmp_out=tmp, partition_size=16, **a
        )
    out_storage = torch.zeros(2 * 8 * parts * 64)
    a["out"] = out_storage[: 2 * 8 * 64].view(2, 8, 64)
    with pytest.raises(ValueError, match="tmp_out overlaps out"):
        ops.paged_attention_v2(
            exp_sums=exp_sums,
            max_logits=torch.zeros(2, 8, parts),
            tmp_out=out_storage.view(2, 8, parts, 64),
            partition_size=16,
            **a,
        )


def test_expanded_cache_and_dst_are_refused() -> None:
    k = torch.randn(3, 2, 64)
    kc = torch.zeros(1, 16, 2, 64).expand(6, 16, 2, 64)
    with pytest.raises(ValueError, match="key_cache .* repeats elements"):
        ops.reshape_and_cache_flash(k, k, kc, torch.zeros(6, 16, 2, 64), torch.tensor([0, 16, 33]))
    with pytest.raises(ValueError, match="dst .* repeats elements"):
        ops.swap_blocks(
            torch.arange(24.0).reshape(3, 8),
            torch.zeros(1, 8).expand(3, 8),
            torch.tensor([[0, 0], [1, 1], [2, 2]]),
        )
    with pytest.raises(ValueError, match=r"key_caches\[0\] .* repeats elements"):
        ops.copy_blocks(
            [torch.zeros(1, 8).expand(3, 8)], [torch.zeros(3, 8)], torch.tensor([[0, 1]])
        )


def test_cache_write_from_a_view_of_the_cache_is_refused() -> None:
    kc = np.zeros((4, 16, 2, 64), F32)
    vc = np.zeros((4, 16, 2, 64), F32)
    key = kc.reshape(-1, 2, 64)[10:20]
    with pytest.raises(ValueError, match="key_cache overlaps key"):
        ops.reshape_and_cache_flash(key, key, kc, vc, np.arange(12, 22, dtype=np.int64))
    with pytest.raises(ValueError, match="key_cache and value_cache are the same array"):
        ops.reshape_and_cache_flash(
            np.ones((2, 2, 64), F32), np.ones((2, 2, 64), F32), kc, kc, np.arange(2, dtype=np.int64)
        )


def test_interleaved_key_value_cache_still_works() -> None:
    """FlashInfer's [num_blocks, 2, block_size, heads, head_size] cache: the key and value views
    interleave (their address ranges overlap, their elements do not) and stay accepted."""
    rng = np.random.default_rng(2)
    kv = np.zeros((4, 2, 16, 2, 64), F32)
    key = rng.standard_normal((5, 2, 64)).astype(F32)
    value = rng.standard_normal((5, 2, 64)).astype(F32)
    slots = np.array([0, 1, 17, 40, 63], np.int64)
    ops.reshape_and_cache_flash(key, value, kv[:, 0], kv[:, 1], slots)
    flat_k = kv[:, 0].reshape(-1, 2, 64)
    flat_v = kv[:, 1].reshape(-1, 2, 64)
    np.testing.assert_array_equal(flat_k[slots], key)
    np.testing.assert_array_equal(flat_v[slots], value)
    out = np.zeros((1, 2, 64), F32)
    ops.paged_attention_v1(
        out,
        key[:1].copy(),
        kv[:, 0],
        kv[:, 1],
        2,
        0.125,
        np.array([[0, 1]], np.int32),
        np.array([18], np.int32),
        16,
        18,
    )
    assert np.isfinite(out).all()
