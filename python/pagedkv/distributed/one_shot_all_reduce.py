"""A one-shot all-reduce over symmetric memory for the small messages of a decode step.

NCCL's all-reduce of a decode step's [batch, hidden] activations (8 KB-2 MB) costs ~20-40 us
inside a CUDA graph on 2 H200s (RESULTS.md, "Tensor parallelism"), latency rather than
bandwidth; a Llama-3-8B decode step runs 65 of them. torch's symmetric memory lets each GPU
read its peers' buffers directly over NVLink: the one-shot kernel reads every peer's copy and
sums them in one pass (vLLM's custom all-reduce and SGLang's torch-symm-mem path do the same).

Each rank owns one buffer of ``max_bytes`` in symmetric memory (allocated and exchanged once,
at start-up, by every rank of the group together). An all-reduce copies its input in and has
the kernel write the sum straight back into the input tensor. The buffer's address never
changes, so CUDA graphs capture it like any kernel. A message that does not fit (a long
prefill), or of another dtype, falls back to the group's NCCL all-reduce.

Failure: the kernel waits on its peers' signals with no timeout, and aborting NCCL's
communicators does not reach it; a rank that dies in the middle of a step can leave the
others' GPUs waiting (the workers are killed, the driver's device sync may not return). The
NCCL path ends such a step with an error instead: one reason "nccl" stays the default.
"""

from __future__ import annotations

from typing import Any

import torch

# A batch-256 decode step of a 4096-wide bf16 model is 2 MiB.
DEFAULT_MAX_BYTES = 4 << 20


class OneShotAllReduce:
    def __init__(
        self, device_group: Any, dtype: torch.dtype, device: torch.device, max_bytes: int
    ) -> None:
        """Every rank of ``device_group`` (an NCCL group) must build it at the same point."""
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = device_group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # (required before torch 2.9)
            symm_mem.enable_symm_mem_for_group(self.group_name)
        numel = max_bytes // torch.empty((), dtype=dtype).element_size()
        self.buffer = symm_mem.empty(numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buffer, self.group_name)
        self.op = torch.ops.symm_mem.one_shot_all_reduce_out

    def can_reduce(self, x: torch.Tensor) -> bool:
        return (
            x.dtype == self.buffer.dtype
            and x.is_contiguous()
            and x.numel() <= self.buffer.numel()
            and (x.numel() * x.element_size()) % 16 == 0  # (the kernel's vector width)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The group's sum of ``x``, written into ``x`` (can_reduce(x) must hold)."""
        staged = self.buffer[: x.numel()]
        staged.copy_(x.view(-1))
        self.op(staged, "sum", self.group_name, x.view(-1))
        return x
