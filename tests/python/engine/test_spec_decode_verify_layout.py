"""The padded layout of the CUDA verification graphs (spec_decode/verify_graph.py), checked on
the CPU: every speculative step of a real engine run is also run eagerly with each entry padded
to k+1 query tokens and one padding entry more, and the padded forward's rows must equal the
plain forward's (padding tokens write nothing, see nothing of the real ones' future, and
change no real row)."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import torch
from pagedkv import SamplingParams
from pagedkv.engine.plan_arrays import PlanArrays
from pagedkv.engine.spec_decode.verify_graph import padded_layout
from support.engine import assert_no_leak
from support.speculation import save_cpu_target, spec_cpu_llm

K = 4
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3}


def _padded_plan(plan: Any, q: int, bs: int, block_size: int) -> tuple:
    lay = padded_layout(plan, q, bs)
    arrays = PlanArrays.from_plan(plan, block_size)
    tables = np.zeros((bs, arrays.block_tables.shape[1]), dtype=np.int32)
    tables[: int(plan.num_seqs)] = arrays.block_tables
    empty = np.zeros((0, 2), dtype=np.int64)
    padded = PlanArrays(
        step=int(plan.step),
        num_seqs=bs,
        num_prefills=bs,
        num_prefill_tokens=bs * q,
        num_decode_tokens=0,
        num_tokens=bs * q,
        max_query_len=q,
        max_decode_seq_len=0,
        input_ids=lay.ids.astype(np.int32),
        positions=lay.positions,
        slot_mapping=lay.slots,
        seq_lens=lay.seq_lens,
        query_start_loc=np.arange(0, (bs + 1) * q, q, dtype=np.int32),
        block_tables=tables,
        blocks_to_swap_out=empty,
        blocks_to_swap_in=empty,
        blocks_to_copy=empty,
    )
    return padded, lay


def test_padded_verification_rows_equal_the_plain_forward(tmp_path: Any) -> None:
    llm = spec_cpu_llm(save_cpu_target(str(tmp_path)), speculative_config=NGRAM)
    runner = llm.llm_engine.runner
    plain_execute = runner.execute
    checked: List[int] = []

    def execute(plan: Any, *args: Any, **kw: Any) -> torch.Tensor:
        hidden = plain_execute(plan, *args, **kw)
        if int(plan.num_draft_tokens_total) and int(plan.max_query_len) <= K + 1:
            bs = int(plan.num_seqs) + 1  # one padding entry too
            padded, lay = _padded_plan(plan, K + 1, bs, runner.block_size)
            again = plain_execute(padded)
            torch.testing.assert_close(again[torch.from_numpy(lay.rows)], hidden)
            checked.append(int(plan.num_seqs))
        return hidden

    runner.execute = execute
    prompts = [
        [5, 6, 7, 8, 9] * 6 + [5, 6],
        [128, 6] * 8 + [3, 4, 5],
        [200, 201, 202, 17, 18] * 4,
    ]
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert checked and max(checked) > 1, "no speculative step with several entries ran"
    assert_no_leak(llm)
