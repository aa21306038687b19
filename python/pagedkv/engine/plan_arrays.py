"""PlanArrays: what a worker needs of one StepPlan, copied into plain numpy arrays.

The C++ scheduler runs once, on the driver; its StepPlan's arrays are views into the
scheduler's memory, valid until the next schedule(). To run the same step on other ranks the
driver sends this copy (as flat bytes: command_codec.py): the same fields, the same meaning (the
metadata contract of the StepPlan is unchanged), trimmed to the rows and block-table columns the
step uses. ModelRunner reads it exactly as it reads a StepPlan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# The fields by kind (the command codec writes the scalars as words, the arrays as bytes).
SCALAR_FIELDS = (
    "step",
    "num_seqs",
    "num_prefills",
    "num_prefill_tokens",
    "num_decode_tokens",
    "num_tokens",
    "max_query_len",
    "max_decode_seq_len",
)


@dataclass
class PlanArrays:  # (new fields: scalars go in SCALAR_FIELDS; every other field is an array)
    step: int
    num_seqs: int
    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_tokens: int
    max_query_len: int
    max_decode_seq_len: int
    input_ids: np.ndarray  # [num_tokens] int32
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    seq_lens: np.ndarray  # [num_seqs] int32
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    block_tables: np.ndarray  # [num_seqs, blocks of the longest sequence] int32
    blocks_to_swap_out: np.ndarray  # [k, 2] int64
    blocks_to_swap_in: np.ndarray  # [k, 2] int64
    blocks_to_copy: np.ndarray  # [k, 2] int64

    @classmethod
    def from_plan(cls, plan: Any, block_size: int) -> PlanArrays:
        n, t = int(plan.num_seqs), int(plan.num_tokens)
        seq_lens = np.array(plan.seq_lens[:n])
        width = max(1, -(-int(seq_lens.max()) // block_size)) if n else 1
        return cls(
            **{k: int(getattr(plan, k)) for k in SCALAR_FIELDS},
            input_ids=np.array(plan.input_ids[:t]),
            positions=np.array(plan.positions[:t]),
            slot_mapping=np.array(plan.slot_mapping[:t]),
            seq_lens=seq_lens,
            query_start_loc=np.array(plan.query_start_loc[: n + 1]),
            block_tables=np.array(plan.block_tables[:n, :width]),
            blocks_to_swap_out=np.array(plan.blocks_to_swap_out),
            blocks_to_swap_in=np.array(plan.blocks_to_swap_in),
            blocks_to_copy=np.array(plan.blocks_to_copy),
        )
