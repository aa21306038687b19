"""Array and scalar arguments of the ops at their edges: read-only arrays (accepted where the op
only reads them, a ValueError naming the argument where it writes them), zero-size batches
(no-ops, whatever strides numpy gives empty arrays), and scalar / shape errors that name the
argument instead of nanobind's signature dump or Python unpacking errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from pagedkv import PagedAttention, ops
from support.deps import need

F32 = np.float32


def ro(a: np.ndarray) -> np.ndarray:
    """A read-only copy of ``a``."""
    b = a.copy()
    b.setflags(write=False)
    return b


def decode_args(num_seqs: int = 2) -> dict[str, Any]:
    """A valid paged_attention_v1 call: 8 heads over 2 KV heads, head 64, block 16, vLLM
    layout."""
    rng = np.random.default_rng(0)
    return dict(
        out=np.zeros((num_seqs, 8, 64), F32),
        query=rng.standard_normal((num_seqs, 8, 64)).astype(F32),
        key_cache=rng.standard_normal((6, 2, 16, 16, 4)).astype(F32),
        value_cache=rng.standard_normal((6, 2, 64, 16)).astype(F32),
        num_kv_heads=2,
        scale=0.125,
        block_tables=np.array([[0, 1, 2], [3, 4, 0]], np.int32)[:num_seqs],
        seq_lens=np.array([40, 20], np.int32)[:num_seqs],
        block_size=16,
        max_seq_len=40,
        alibi_slopes=np.linspace(0.1, 0.8, 8).astype(F32),
    )


def v2_buffers(a: dict[str, Any], parts: int = 1) -> dict[str, Any]:
    s, h, d = a["query"].shape
    return dict(
        exp_sums=np.zeros((s, h, parts), F32),
        max_logits=np.zeros((s, h, parts), F32),
        tmp_out=np.zeros((s, h, parts, d), F32),
    )


def prefill_args(num_tokens: int = 7) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    lens = [3, 4] if num_tokens == 7 else [0, 0]
    start = np.cumsum([0, *lens]).astype(np.int32)
    return dict(
        q=rng.standard_normal((num_tokens, 4, 64)).astype(F32),
        k=rng.standard_normal((num_tokens, 2, 64)).astype(F32),
        v=rng.standard_normal((num_tokens, 2, 64)).astype(F32),
        o=np.zeros((num_tokens, 4, 64), F32),
        kv_cache_dtype="auto",
        k_cache=rng.standard_normal((4, 16, 2, 64)).astype(F32),
        v_cache=rng.standard_normal((4, 16, 2, 64)).astype(F32),
        b_loc=np.array([[0, 1], [2, 3]], np.int32),
        b_start_loc=start,
        b_seq_len=np.array([20 + lens[0], lens[1]], np.int32),
        max_seq_len=None,
        max_input_len=4,
        alibi_slopes=np.linspace(0.1, 0.4, 4).astype(F32),
    )


def write_args(num_tokens: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    return dict(
        key=rng.standard_normal((num_tokens, 2, 64)).astype(F32),
        value=rng.standard_normal((num_tokens, 2, 64)).astype(F32),
        key_cache=np.zeros((4, 16, 2, 64), F32),
        value_cache=np.zeros((4, 16, 2, 64), F32),
        slot_mapping=np.array([0, 1, 17, -1, 63], np.int64)[:num_tokens],
    )


# ---- read-only inputs are accepted -----------------------------------------------------------

READ_ONLY_MAKERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "setflags": ro,
    "broadcast_to": lambda a: np.broadcast_to(a, a.shape),
}


@pytest.mark.parametrize("make", list(READ_ONLY_MAKERS))
def test_decode_reads_read_only_inputs(make: str) -> None:
    want = decode_args()
    ops.paged_attention_v1(**want)
    a = decode_args()
    for name in ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "alibi_slopes"):
        a[name] = READ_ONLY_MAKERS[make](a[name])
        assert not a[name].flags.writeable
    ops.paged_attention_v1(**a)
    np.testing.assert_array_equal(a["out"], want["out"])
    b = decode_args()
    for name in ("query", "key_cache", "value_cache", "block_tables", "seq_lens"):
        b[name] = ro(b[name])
    out_v2 = v2_buffers(b)
    ops.paged_attention_v2(**b, **out_v2)
    np.testing.assert_allclose(b["out"], want["out"], rtol=1e-5, atol=1e-6)


def test_broadcast_inputs_with_zero_strides() -> None:
    """np.broadcast_to repeats one row with stride 0: allowed where strides are free."""
    a = decode_args()
    a["seq_lens"] = np.broadcast_to(np.int32(20), (2,))
    a["alibi_slopes"] = np.broadcast_to(F32(0.5), (8,))
    ops.paged_attention_v1(**a)
    b = decode_args()
    b["seq_lens"] = np.array([20, 20], np.int32)
    b["alibi_slopes"] = np.full(8, 0.5, F32)
    ops.paged_attention_v1(**b)
    np.testing.assert_array_equal(a["out"], b["out"])


def test_read_only_memmap_cache(tmp_path: Path) -> None:
    a = decode_args()
    np.save(tmp_path / "k.npy", a["key_cache"])
    np.save(tmp_path / "v.npy", a["value_cache"])
    want = decode_args()
    ops.paged_attention_v1(**want)
    a["key_cache"] = np.load(tmp_path / "k.npy", mmap_mode="r")
    a["value_cache"] = np.load(tmp_path / "v.npy", mmap_mode="r")
    ops.paged_attention_v1(**a)
    np.testing.assert_array_equal(a["out"], want["out"])


def test_prefill_and_writes_read_read_only_inputs() -> None:
    want = prefill_args()
    ops.context_attention_fwd(**want)
    a = prefill_args()
    for name in (
        "q",
        "k",
        "v",
        "k_cache",
        "v_cache",
        "b_loc",
        "b_start_loc",
        "b_seq_len",
        "alibi_slopes",
    ):
        a[name] = ro(a[name])
    ops.context_attention_fwd(**a)
    np.testing.assert_array_equal(a["o"], want["o"])

    w = write_args()
    ops.reshape_and_cache_flash(**w)
    r = write_args()
    for name in ("key", "value", "slot_mapping"):
        r[name] = ro(r[name])
    ops.reshape_and_cache_flash(**r)
    np.testing.assert_array_equal(r["key_cache"], w["key_cache"])

    src = np.arange(4 * 8, dtype=F32).reshape(4, 8)
    dst = np.zeros((2, 8), F32)
    ops.swap_blocks(ro(src), dst, ro(np.array([[3, 1]], np.int64)))
    np.testing.assert_array_equal(dst[1], src[3])
    kc = np.arange(4 * 8, dtype=F32).reshape(4, 8)
    vc = kc + 100
    ops.copy_blocks([kc], [vc], ro(np.array([[0, 2]], np.int64)))
    assert kc[2, 0] == 0 and vc[2, 0] == 100

    q = ro(decode_args()["query"])
    a = decode_args()
    assert ops.decode_kernel(q, ro(a["key_cache"]), ro(a["value_cache"]), 2) == "cpu"
    assert ops.decode_partition_size(q, ro(a["key_cache"]), ro(a["value_cache"]), 2, 40) == 0


def test_paged_attention_forward_with_read_only_inputs() -> None:
    a = decode_args()
    want = PagedAttention.forward_decode(
        a["query"],
        a["key_cache"],
        a["value_cache"],
        a["block_tables"],
        a["seq_lens"],
        40,
        "auto",
        2,
        0.125,
        None,
        1.0,
        1.0,
    )
    got = PagedAttention.forward_decode(
        ro(a["query"]),
        ro(a["key_cache"]),
        ro(a["value_cache"]),
        ro(a["block_tables"]),
        ro(a["seq_lens"]),
        40,
        "auto",
        2,
        0.125,
        None,
        1.0,
        1.0,
    )
    np.testing.assert_array_equal(got, want)


def test_torch_inputs_still_work() -> None:
    torch = need("torch")
    a = decode_args()
    want = decode_args()
    ops.paged_attention_v1(**want)
    t = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
    ops.paged_attention_v1(**t)
    np.testing.assert_array_equal(t["out"].numpy(), want["out"])


# ---- read-only outputs are a ValueError naming them --------------------------------------------


def _read_only_output_cases() -> dict[str, tuple[Callable[[], None], str]]:
    def v1() -> None:
        a = decode_args()
        a["out"] = ro(a["out"])
        ops.paged_attention_v1(**a)

    def v2(name: str) -> Callable[[], None]:
        def call() -> None:
            a = decode_args()
            bufs = v2_buffers(a)
            if name == "out":
                a["out"] = ro(a["out"])
            else:
                bufs[name] = ro(bufs[name])
            ops.paged_attention_v2(**a, **bufs)

        return call

    def prefill() -> None:
        a = prefill_args()
        a["o"] = ro(a["o"])
        ops.context_attention_fwd(**a)

    def write(name: str, flash: bool) -> Callable[[], None]:
        def call() -> None:
            a = write_args()
            if not flash:
                a["key_cache"] = np.zeros((4, 2, 16, 16, 4), F32)
                a["value_cache"] = np.zeros((4, 2, 64, 16), F32)
            a[name] = np.broadcast_to(a[name], a[name].shape)
            (ops.reshape_and_cache_flash if flash else ops.reshape_and_cache)(**a)

        return call

    def swap() -> None:
        ops.swap_blocks(
            np.zeros((4, 8), F32), ro(np.zeros((4, 8), F32)), np.array([[0, 1]], np.int64)
        )

    def copy(which: str) -> Callable[[], None]:
        def call() -> None:
            caches = {"key": [np.zeros((4, 8), F32)], "value": [np.zeros((4, 8), F32)]}
            caches[which][0] = ro(caches[which][0])
            ops.copy_blocks(caches["key"], caches["value"], np.array([[0, 1]], np.int64))

        return call

    return {
        "v1_out": (v1, "out is read-only"),
        "v2_out": (v2("out"), "out is read-only"),
        "v2_exp_sums": (v2("exp_sums"), "exp_sums is read-only"),
        "v2_max_logits": (v2("max_logits"), "max_logits is read-only"),
        "v2_tmp_out": (v2("tmp_out"), "tmp_out is read-only"),
        "prefill_out": (prefill, "out is read-only"),
        "write_key_cache": (write("key_cache", False), "key_cache is read-only"),
        "write_flash_value_cache": (write("value_cache", True), "value_cache is read-only"),
        "swap_dst": (swap, "dst is read-only"),
        "copy_key_caches": (copy("key"), "key_caches[0] is read-only"),
        "copy_value_caches": (copy("value"), "value_caches[0] is read-only"),
    }


@pytest.mark.parametrize("case", list(_read_only_output_cases()))
def test_read_only_output_is_a_value_error_naming_it(case: str) -> None:
    call, message = _read_only_output_cases()[case]
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


# ---- zero-size batches are no-ops ------------------------------------------------------------


def test_zero_size_arrays_have_free_strides() -> None:
    z = np.zeros((0, 2, 64), F32)
    assert z.strides == (0, 0, 0) or z.strides[-1] != 4  # what numpy exports for empty arrays
    a = write_args(0)
    a["key"] = a["value"] = z
    before = a["key_cache"].copy()
    ops.reshape_and_cache_flash(**a)
    np.testing.assert_array_equal(a["key_cache"], before)
    a["key_cache"] = np.zeros((4, 2, 16, 16, 4), F32)
    a["value_cache"] = np.zeros((4, 2, 64, 16), F32)
    ops.reshape_and_cache(**a)
    assert not a["key_cache"].any()


def test_decode_with_no_sequences() -> None:
    a = decode_args(0)
    a["max_seq_len"] = 0
    assert a["query"].shape == (0, 8, 64)
    ops.paged_attention_v1(**a)
    ops.paged_attention_v2(**a, **v2_buffers(a, parts=0))
    out = PagedAttention.forward_decode(
        a["query"],
        a["key_cache"],
        a["value_cache"],
        a["block_tables"],
        a["seq_lens"],
        0,
        "auto",
        2,
        0.125,
        None,
        1.0,
        1.0,
    )
    assert out.shape == (0, 8, 64)


def test_prefill_with_no_tokens() -> None:
    a = prefill_args(0)
    assert a["q"].shape == (0, 4, 64)
    ops.context_attention_fwd(**a)
    a["b_loc"] = np.zeros((0, 2), np.int32)
    a["b_start_loc"] = np.zeros(1, np.int32)
    a["b_seq_len"] = np.zeros(0, np.int32)
    ops.context_attention_fwd(**a)
    out = PagedAttention.forward_prefix(
        a["q"],
        a["k"],
        a["v"],
        "auto",
        a["k_cache"],
        a["v_cache"],
        a["b_loc"],
        a["b_start_loc"],
        a["b_seq_len"],
        0,
        None,
        None,
        1.0,
        1.0,
    )
    assert out.shape == (0, 4, 64)


def test_copy_and_swap_with_empty_mapping() -> None:
    empty = np.zeros((0, 2), np.int64)
    kc, vc = np.ones((4, 8), F32), np.ones((4, 8), F32)
    ops.copy_blocks([kc], [vc], empty)
    src, dst = np.ones((4, 8), F32), np.zeros((2, 8), F32)
    ops.swap_blocks(src, dst, empty)
    assert not dst.any() and kc.all()
    # Caches with no blocks at all (size 0, so any strides).
    ops.copy_blocks([np.zeros((0, 8), F32)], [np.zeros((0, 8), F32)], empty)
    ops.swap_blocks(np.zeros((0, 8), F32), np.zeros((0, 8), F32), empty)


# ---- scalar and shape arguments are named in errors --------------------------------------------


def _v1(**changes: Any) -> None:
    a = decode_args()
    a.update(changes)
    ops.paged_attention_v1(**a)


@pytest.mark.parametrize(
    ("changes", "exc", "message"),
    [
        ({"max_seq_len": 2**40}, ValueError, "max_seq_len = 1099511627776 is out of range"),
        ({"num_kv_heads": 2**40}, ValueError, "num_kv_heads = 1099511627776 is out of range"),
        ({"num_kv_heads": -(2**31) - 1}, ValueError, "num_kv_heads"),
        ({"num_kv_heads": 2.7}, TypeError, "num_kv_heads must be an integer, got 2.7"),
        ({"num_kv_heads": float("nan")}, TypeError, "num_kv_heads must be an integer"),
        ({"max_seq_len": "40"}, TypeError, "max_seq_len must be an integer, got str"),
        ({"block_size": 16.5}, TypeError, "block_size must be an integer"),
        ({"sliding_window": 2**33}, ValueError, "sliding_window"),
        ({"sliding_window": 3.5}, TypeError, "sliding_window"),
        ({"scale": "0.1"}, TypeError, "scale"),
        ({"logits_soft_cap": None}, TypeError, "logits_soft_cap"),
        ({"kv_cache_dtype": None}, TypeError, "kv_cache_dtype must be a str"),
        ({"alibi_slopes": [0.1] * 8}, TypeError, "alibi_slopes must be an array"),
    ],
)
def test_scalar_argument_errors_name_the_argument(
    changes: dict[str, Any], exc: type, message: str
) -> None:
    with pytest.raises(exc, match=message):
        _v1(**changes)


def test_integral_values_of_other_types_are_accepted() -> None:
    want = decode_args()
    ops.paged_attention_v1(**want)
    a = decode_args()
    a.update(
        num_kv_heads=np.int64(2), max_seq_len=40.0, block_size=np.int32(16), scale=np.float32(0.125)
    )
    ops.paged_attention_v1(**a)
    np.testing.assert_array_equal(a["out"], want["out"])


def test_other_int_arguments_are_range_checked() -> None:
    a = decode_args()
    with pytest.raises(ValueError, match="partition_size"):
        ops.paged_attention_v2(**a, **v2_buffers(a), partition_size=2**32)
    p = prefill_args()
    p["max_input_len"] = 2**31
    with pytest.raises(ValueError, match="max_input_len"):
        ops.context_attention_fwd(**p)
    with pytest.raises(ValueError, match="num_sms"):
        from pagedkv.attention import decode_partition_size

        decode_partition_size(1, 8, 2, 100, 16, 2**31, "hopper")


def test_stream_handles_out_of_range_name_the_argument() -> None:
    a = decode_args()
    for bad in (-1, 2**64):
        with pytest.raises(ValueError, match=r"^stream: .*pointer"):
            ops.paged_attention_v1(**a, stream=bad)


def test_non_array_reaching_the_extension_names_the_argument() -> None:
    """Objects that pass the Python-side check but cannot be imported (an object-dtype numpy
    array) are named by the extension, not reported as a signature mismatch."""
    a = decode_args()
    a["seq_lens"] = np.array([40, None], dtype=object)
    with pytest.raises(TypeError, match="seq_lens must be an array"):
        ops.paged_attention_v1(**a)


def test_fp8_cache_dtype_says_use_uint8() -> None:
    torch = need("torch")
    a = decode_args()
    kc = torch.zeros(6, 2, 4, 16, 16, dtype=torch.float8_e4m3fn)
    vc = torch.zeros(6, 2, 64, 16, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"key_cache has dtype torch.float8_e4m3fn.*uint8"):
        ops.paged_attention_v1(
            torch.zeros(2, 8, 64),
            torch.zeros(2, 8, 64),
            kc,
            vc,
            2,
            0.1,
            torch.from_numpy(a["block_tables"]),
            torch.from_numpy(a["seq_lens"]),
            16,
            40,
            None,
            "fp8",
        )
    from pagedkv import _C

    # The extension's own message, for callers of _C (DLPack 1.1 fp8 dtype code).
    with pytest.raises(TypeError, match=r"key_cache: fp8 arrays .*uint8"):
        _C.ops_decode_kernel(torch.zeros(2, 8, 64), kc, vc, 2, "fp8")
    # The supported form runs.
    out = torch.zeros(2, 8, 64)
    ops.paged_attention_v1(
        out,
        torch.zeros(2, 8, 64),
        kc.view(torch.uint8),
        vc.view(torch.uint8),
        2,
        0.1,
        torch.from_numpy(a["block_tables"]),
        torch.from_numpy(a["seq_lens"]),
        16,
        40,
        None,
        "fp8",
    )


@pytest.mark.parametrize("method", ["decode", "prefix"])
def test_paged_attention_checks_query_rank_before_unpacking(method: str) -> None:
    a = decode_args()
    q2 = np.zeros((2, 512), F32)
    with pytest.raises(ValueError, match=r"query must have rank 3 .*got shape \(2, 512\)"):
        if method == "decode":
            PagedAttention.forward_decode(
                q2,
                a["key_cache"],
                a["value_cache"],
                a["block_tables"],
                a["seq_lens"],
                40,
                "auto",
                2,
                0.125,
                None,
                1.0,
                1.0,
            )
        else:
            p = prefill_args()
            PagedAttention.forward_prefix(
                q2,
                p["k"],
                p["v"],
                "auto",
                p["k_cache"],
                p["v_cache"],
                p["b_loc"],
                p["b_start_loc"],
                p["b_seq_len"],
                4,
                None,
                None,
                1.0,
                1.0,
            )


def test_paged_attention_checks_cache_rank_and_ints() -> None:
    a = decode_args()
    with pytest.raises(ValueError, match="key_cache must have rank 5 or 4"):
        PagedAttention.forward_decode(
            a["query"],
            a["key_cache"][0, 0],
            a["value_cache"],
            a["block_tables"],
            a["seq_lens"],
            40,
            "auto",
            2,
            0.125,
            None,
            1.0,
            1.0,
        )
    with pytest.raises(ValueError, match="max_seq_len"):
        PagedAttention.forward_decode(
            a["query"],
            a["key_cache"],
            a["value_cache"],
            a["block_tables"],
            a["seq_lens"],
            2**40,
            "auto",
            2,
            0.125,
            None,
            1.0,
            1.0,
        )
    with pytest.raises(TypeError, match="num_kv_heads"):
        PagedAttention.forward_decode(
            a["query"],
            a["key_cache"],
            a["value_cache"],
            a["block_tables"],
            a["seq_lens"],
            40,
            "auto",
            2.5,
            0.125,
            None,
            1.0,
            1.0,
        )


@pytest.mark.parametrize(
    ("heads", "head_size", "match"),
    [
        (3, 64, "not a multiple of num_kv_heads \\* head_size = 3 \\* 64"),
        (2, 66, "head_size a multiple of x = 16 // element size = 4"),
        (0, 64, "num_kv_heads = 0"),
    ],
)
def test_split_kv_cache_names_bad_heads_or_head_size(
    heads: int, head_size: int, match: str
) -> None:
    """The views' reshape used to fail with the framework's own error naming no argument
    (torch: "shape '[4, 3, 16, -1, 4]' is invalid for input of size 8192")."""
    for kv in (
        np.zeros(PagedAttention.get_kv_cache_shape(4, 16, 2, 64), np.float32),
        need("torch").zeros(PagedAttention.get_kv_cache_shape(4, 16, 2, 64)),
    ):
        with pytest.raises(ValueError, match=match):
            PagedAttention.split_kv_cache(kv, heads, head_size)
    with pytest.raises(ValueError, match="kv_cache must have shape"):
        PagedAttention.split_kv_cache(np.zeros((4, 2048), np.float32), 2, 64)
