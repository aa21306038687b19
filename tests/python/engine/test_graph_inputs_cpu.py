"""cuda_graph.fill_graph_inputs (the host side of a CUDA-graph replay) on the CPU: a decode plan's
rows land in the mirrors, padding rows get the values the graphs rely on."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from pagedkv.engine.cuda_graph import fill_graph_inputs


def test_rows_and_padding_land_in_the_mirrors():
    n, bs, max_bs, width, block = 3, 4, 8, 5, 16
    rng = np.random.default_rng(0)
    seq_lens = np.array([17, 40, 3], dtype=np.int32)  # 2, 3 and 1 blocks in use
    plan = SimpleNamespace(
        num_seqs=n,
        seq_lens=seq_lens,
        input_ids=rng.integers(0, 100, n).astype(np.int32),
        positions=seq_lens - 1,
        slot_mapping=rng.integers(0, 1000, n),
        block_tables=rng.integers(1, 50, (n, width)).astype(np.int32),
    )
    h64 = np.full((3, max_bs), 7, dtype=np.int64)
    h32 = np.full(max_bs * (1 + width), 9, dtype=np.int32)
    lens, used = fill_graph_inputs(plan, bs, h64, h32, width, block)
    assert used == 3 and np.array_equal(lens, seq_lens)
    assert h64[0, :n].tolist() == plan.input_ids.tolist() and h64[0, n:bs].tolist() == [0]
    assert h64[1, :n].tolist() == plan.positions.tolist() and h64[1, n:bs].tolist() == [0]
    assert h64[2, :n].tolist() == plan.slot_mapping.tolist() and h64[2, n:bs].tolist() == [-1]
    assert h64[:, bs:].tolist() == [[7] * (max_bs - bs)] * 3  # past the batch: untouched
    assert h32[:n].tolist() == seq_lens.tolist() and h32[n:bs].tolist() == [1]
    tables = h32[max_bs:].reshape(max_bs, width)
    assert np.array_equal(tables[:n, :used], plan.block_tables[:, :used])
    assert (tables[:n, used:] == 9).all()  # columns past the longest row: not copied

    other = np.array([5, 6, 7], dtype=np.int64)  # M-RoPE decodes: positions given
    fill_graph_inputs(plan, bs, h64, h32, width, block, positions=other)
    assert h64[1, :n].tolist() == [5, 6, 7]
