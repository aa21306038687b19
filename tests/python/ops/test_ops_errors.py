"""Malformed op calls raise ValueError / TypeError naming the argument, and never crash.

All bad calls run in one child process (a crash there — a signal — fails every case that had
not reported yet); each case is then checked as its own test from the child's report.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    from pagedkv import ops

    def base():
        """A valid decode call: 2 seqs, 8 heads over 2 KV heads, head 64, block 16, vLLM layout."""
        rng = np.random.default_rng(0)
        f = np.float32
        return dict(
            out=np.zeros((2, 8, 64), f), query=rng.standard_normal((2, 8, 64)).astype(f),
            key_cache=rng.standard_normal((6, 2, 16, 16, 4)).astype(f),
            value_cache=rng.standard_normal((6, 2, 64, 16)).astype(f), num_kv_heads=2,
            scale=0.125, block_tables=np.array([[0, 1, 2], [3, 4, 0]], np.int32),
            seq_lens=np.array([40, 20], np.int32), block_size=16, max_seq_len=40,
            alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)

    def v1(**changes):
        a = base(); a.update(changes); ops.paged_attention_v1(**a)

    def v2(parts=1, **changes):
        a = base(); a.update(changes)
        s, h, d = a["query"].shape
        ops.paged_attention_v2(exp_sums=np.zeros((s, h, parts), np.float32),
                               max_logits=np.zeros((s, h, parts), np.float32),
                               tmp_out=np.zeros((s, h, parts, d), np.float32), **a)

    def write(flash=False, **changes):
        rng = np.random.default_rng(1)
        a = dict(key=rng.standard_normal((5, 2, 64)).astype(np.float32),
                 value=rng.standard_normal((5, 2, 64)).astype(np.float32),
                 key_cache=np.zeros((4, 2, 16, 16, 4), np.float32),
                 value_cache=np.zeros((4, 2, 64, 16), np.float32),
                 slot_mapping=np.array([0, 1, 17, -1, 63], np.int64), kv_cache_dtype="auto",
                 k_scale=1.0, v_scale=1.0)
        if flash:
            a["key_cache"] = np.zeros((4, 16, 2, 64), np.float32)
            a["value_cache"] = np.zeros((4, 16, 2, 64), np.float32)
        a.update(changes)
        (ops.reshape_and_cache_flash if flash else ops.reshape_and_cache)(**a)

    def prefill(**changes):
        rng = np.random.default_rng(2)
        f = np.float32
        a = dict(q=rng.standard_normal((7, 4, 64)).astype(f),
                 k=rng.standard_normal((7, 2, 64)).astype(f),
                 v=rng.standard_normal((7, 2, 64)).astype(f), o=np.zeros((7, 4, 64), f),
                 kv_cache_dtype="auto", k_cache=np.zeros((4, 16, 2, 64), f),
                 v_cache=np.zeros((4, 16, 2, 64), f),
                 b_loc=np.array([[0, 1], [2, 3]], np.int32),
                 b_start_loc=np.array([0, 3, 7], np.int32),
                 b_seq_len=np.array([20, 4], np.int32), max_seq_len=None, max_input_len=4)
        a.update(changes)
        ops.context_attention_fwd(**a)

    f32 = np.float32
    CASES = {
        "valid_v1": lambda: v1(),
        "valid_v2": lambda: v2(),
        "valid_write": lambda: write(),
        "valid_prefill": lambda: prefill(),
        "head_size": lambda: v1(query=np.zeros((2, 8, 48), f32), out=np.zeros((2, 8, 48), f32)),
        "num_kv_heads_divides": lambda: v1(num_kv_heads=3),
        "num_kv_heads_vs_cache": lambda: v1(num_kv_heads=4),
        "block_id_out_of_range": lambda: v1(block_tables=np.array([[0, 1, 9], [3, 4, 0]],
                                                                   np.int32)),
        "negative_block_id": lambda: v1(block_tables=np.array([[0, -1, 2], [3, 4, 0]],
                                                               np.int32)),
        "seq_len_beyond_table": lambda: v1(seq_lens=np.array([40, 60], np.int32),
                                           max_seq_len=60),
        "seq_len_beyond_max": lambda: v1(max_seq_len=30),
        "block_tables_dtype": lambda: v1(block_tables=np.array([[0, 1, 2], [3, 4, 0]])),
        "seq_lens_dtype": lambda: v1(seq_lens=np.array([40, 20], np.float32)),
        "query_dtype": lambda: v1(query=np.zeros((2, 8, 64)), out=np.zeros((2, 8, 64))),
        "out_dtype": lambda: v1(out=np.zeros((2, 8, 64), np.float16)),
        "query_rank": lambda: v1(query=np.zeros((2, 512), f32)),
        "query_not_contiguous": lambda: v1(query=np.zeros((2, 64, 8), f32).transpose(0, 2, 1)),
        "key_cache_not_contiguous": lambda: v1(
            key_cache=np.zeros((6, 16, 2, 16, 4), f32).transpose(0, 2, 1, 3, 4)),
        "key_cache_x": lambda: v1(key_cache=np.zeros((6, 2, 8, 16, 8), f32)),
        "key_cache_rank": lambda: v1(key_cache=np.zeros((6, 2, 64, 16), f32)[..., None, None,
                                                                               None]),
        "value_cache_shape": lambda: v1(value_cache=np.zeros((6, 2, 64, 8), f32)),
        "cache_dtype": lambda: v1(key_cache=np.zeros((6, 2, 8, 16, 8), np.float16)),
        "fp8_needs_uint8": lambda: v1(kv_cache_dtype="fp8"),
        "kv_cache_dtype_name": lambda: v1(kv_cache_dtype="int4"),
        "k_scale_nonpositive": lambda: v1(k_scale=0.0),
        # 1 / scale overflows: the CPU fp8 write stored 0 * inf = NaN for every zero.
        "k_scale_denormal": lambda: write(flash=True, k_scale=1e-45),
        "v_scale_reciprocal_inf": lambda: v1(v_scale=2e-39),
        "k_scale_array_size": lambda: v1(k_scale=np.array([1.0, 2.0])),
        "alibi_shape": lambda: v1(alibi_slopes=np.zeros(3, f32)),
        "alibi_dtype": lambda: v1(alibi_slopes=np.zeros(8)),
        "soft_cap_negative": lambda: v1(logits_soft_cap=-1.0),
        "block_size_arg": lambda: v1(block_size=32),
        "query_list": lambda: v1(query=[[0.0] * 64] * 16),
        "block_tables_list": lambda: v1(block_tables=[[0, 1, 2], [3, 4, 0]]),
        "blocksparse": lambda: v1(blocksparse_vert_stride=4),
        "stream_type": lambda: v1(stream="default"),
        "v2_partitions": lambda: v2(parts=1, seq_lens=np.array([40, 20], np.int32),
                                    max_seq_len=600),
        "slot_out_of_range": lambda: write(slot_mapping=np.array([0, 1, 64, -1, 3], np.int64)),
        "slot_mapping_dtype": lambda: write(slot_mapping=np.array([0, 1, 2, 3, 4], np.int32)),
        "slot_mapping_too_long": lambda: write(slot_mapping=np.arange(6, dtype=np.int64)),
        "write_layout": lambda: write(key_cache=np.zeros((4, 16, 2, 64), f32),
                                      value_cache=np.zeros((4, 16, 2, 64), f32)),
        "write_value_shape": lambda: write(value=np.zeros((5, 2, 32), f32)),
        "write_cache_dtype": lambda: write(flash=True,
                                           key_cache=np.zeros((4, 16, 2, 64), np.float16)),
        "write_key_cache_list": lambda: write(flash=True, key_cache=[0.0]),
        "prefill_q_len": lambda: prefill(max_input_len=3),
        "prefill_seq_lens": lambda: prefill(b_seq_len=np.array([2, 4], np.int32)),
        "prefill_block_id": lambda: prefill(b_loc=np.array([[0, 7], [2, 3]], np.int32)),
        "prefill_context_beyond_table": lambda: prefill(b_seq_len=np.array([40, 4], np.int32)),
        "prefill_start_loc_shape": lambda: prefill(b_start_loc=np.array([0, 3], np.int32)),
        "prefill_key_heads": lambda: prefill(k=np.zeros((7, 3, 64), f32),
                                             v=np.zeros((7, 3, 64), f32)),
        "copy_blocks_range": lambda: ops.copy_blocks(
            [np.zeros((4, 8), f32)], [np.zeros((4, 8), f32)], np.array([[0, 4]], np.int64)),
        "copy_blocks_not_list": lambda: ops.copy_blocks(
            np.zeros((4, 8), f32), [np.zeros((4, 8), f32)], np.array([[0, 1]], np.int64)),
        "copy_blocks_layers": lambda: ops.copy_blocks(
            [np.zeros((4, 8), f32)], [], np.array([[0, 1]], np.int64)),
        "swap_blocks_shape": lambda: ops.swap_blocks(
            np.zeros((4, 8), f32), np.zeros((4, 9), f32), np.array([[0, 1]], np.int64)),
        "swap_blocks_range": lambda: ops.swap_blocks(
            np.zeros((4, 8), f32), np.zeros((2, 8), f32), np.array([[3, 2]], np.int64)),
    }

    for name in sys.argv[1:]:
        try:
            CASES[name]()
            res = {"type": None, "msg": ""}
        except Exception as e:  # noqa: BLE001 - reported to the parent
            res = {"type": type(e).__name__, "msg": str(e)}
        print(json.dumps({"case": name, **res}), flush=True)
''')

# case -> (expected exception type or None, substring the message must contain)
EXPECTED = {
    "valid_v1": (None, ""),
    "valid_v2": (None, ""),
    "valid_write": (None, ""),
    "valid_prefill": (None, ""),
    "head_size": ("ValueError", "head size"),
    "num_kv_heads_divides": ("ValueError", "num_kv_heads"),
    "num_kv_heads_vs_cache": ("ValueError", "num_kv_heads"),
    "block_id_out_of_range": ("ValueError", "block_tables[0, 2]"),
    "negative_block_id": ("ValueError", "block_tables[0, 1]"),
    "seq_len_beyond_table": ("ValueError", "seq_lens[1]"),
    "seq_len_beyond_max": ("ValueError", "max_seq_len"),
    "block_tables_dtype": ("TypeError", "block_tables"),
    "seq_lens_dtype": ("TypeError", "seq_lens"),
    "query_dtype": ("TypeError", "query"),
    "out_dtype": ("TypeError", "out"),
    "query_rank": ("ValueError", "query"),
    "query_not_contiguous": ("ValueError", "query"),
    "key_cache_not_contiguous": ("ValueError", "key_cache"),
    "key_cache_x": ("ValueError", "key_cache"),
    "key_cache_rank": ("ValueError", "key_cache"),
    "value_cache_shape": ("ValueError", "value_cache"),
    "cache_dtype": ("TypeError", "key_cache"),
    "fp8_needs_uint8": ("TypeError", "uint8"),
    "kv_cache_dtype_name": ("ValueError", "kv_cache_dtype"),
    "k_scale_nonpositive": ("ValueError", "k_scale"),
    "k_scale_denormal": (
        "ValueError",
        "k_scale must be a positive finite number with a finite reciprocal",
    ),
    "v_scale_reciprocal_inf": ("ValueError", "v_scale"),
    "k_scale_array_size": ("ValueError", "k_scale"),
    "alibi_shape": ("ValueError", "alibi_slopes"),
    "alibi_dtype": ("TypeError", "alibi_slopes"),
    "soft_cap_negative": ("ValueError", "logits_soft_cap"),
    "block_size_arg": ("ValueError", "block_size"),
    "query_list": ("TypeError", "query"),
    "block_tables_list": ("TypeError", "block_tables"),
    "blocksparse": ("ValueError", "blocksparse"),
    "stream_type": ("TypeError", "stream"),
    "v2_partitions": ("ValueError", "exp_sums"),
    "slot_out_of_range": ("ValueError", "slot_mapping[2]"),
    "slot_mapping_dtype": ("TypeError", "slot_mapping"),
    "slot_mapping_too_long": ("ValueError", "slot_mapping"),
    "write_layout": ("ValueError", "key_cache"),
    "write_value_shape": ("ValueError", "value"),
    "write_cache_dtype": ("TypeError", "key_cache"),
    "write_key_cache_list": ("TypeError", "key_cache"),
    "prefill_q_len": ("ValueError", "max_query_len"),
    "prefill_seq_lens": ("ValueError", "seq_lens[0]"),
    "prefill_block_id": ("ValueError", "block_tables[0, 1]"),
    "prefill_context_beyond_table": ("ValueError", "block table"),
    "prefill_start_loc_shape": ("ValueError", "query_start_loc"),
    "prefill_key_heads": ("ValueError", "key"),
    "copy_blocks_range": ("ValueError", "block_mapping[0, 1]"),
    "copy_blocks_not_list": ("TypeError", "key_caches"),
    "copy_blocks_layers": ("ValueError", "value_caches"),
    "swap_blocks_shape": ("ValueError", "dst"),
    "swap_blocks_range": ("ValueError", "block_mapping[0, 1]"),
}


@pytest.fixture(scope="module")
def report() -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *EXPECTED], capture_output=True, text=True, timeout=300
    )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            results[r["case"]] = r
    results["__rc__"] = proc.returncode
    results["__stderr__"] = proc.stderr[-2000:]
    return results


@pytest.mark.parametrize("case", list(EXPECTED))
def test_bad_call(report: dict, case: str) -> None:
    assert case in report, (
        f"child died before reporting {case!r} (rc={report['__rc__']}): {report['__stderr__']}"
    )
    exc, text = EXPECTED[case]
    got = report[case]
    assert got["type"] == exc, got
    assert text in got["msg"], got
