"""LoRA layers: a linear layer of models/linear.py wrapped so that each token of a step adds the
low-rank delta of its own adapter, ``y[t] += (x[t] A_l^T) B_l^T`` with l = the token's slot, for
all adapters of the step in one ``lora_shrink`` and one ``lora_expand`` (pagedkv.ops).

Fused layers hold one slice per projection of the checkpoint (qkv_proj: q/k/v, gate_up_proj:
gate/up); an adapter's A matrices of the slices are stacked into one shrink, and each output
column reads its own slice's part of the shrunk row. The slots' weights live in ``a_stack``
[max_loras, slices * max_rank, in] and ``b_stack`` [max_loras, out, max_rank]; a smaller rank is
zero-padded and a slice the adapter does not target stays zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from pagedkv import ops
from pagedkv.distributed import get_tp_group
from pagedkv.models.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)

# The checkpoint's projections that a fused layer holds, in its output order.
PACKED_MODULES = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
}


@dataclass
class LoRAStep:
    """The adapters of the step under way, shared by every LoRA layer of a model: the slot of
    each token (int32 [T] on the model's device, -1 = no adapter) or None when no token of the
    step has an adapter (the layers then add nothing)."""

    token_lora_indices: Optional[torch.Tensor] = None


class LoRALinear(nn.Module):
    """``base`` (a column-, row-, QKV- or merged-parallel linear) plus the adapters' deltas."""

    a_stack: torch.Tensor
    b_stack: torch.Tensor

    def __init__(
        self,
        base: nn.Module,
        slice_names: list[str],
        slice_sizes: list[int],
        max_loras: int,
        max_rank: int,
        step: LoRAStep,
    ) -> None:
        super().__init__()
        self.base = base
        self.slice_names, self.slice_sizes = slice_names, slice_sizes
        self.max_rank, self.step = max_rank, step
        weight: torch.Tensor = base.weight  # type: ignore[assignment]
        out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
        self.in_features = in_features
        dt, dev = weight.dtype, weight.device
        self.register_buffer(
            "a_stack",
            torch.zeros(max_loras, len(slice_names) * max_rank, in_features, dtype=dt, device=dev),
            persistent=False,
        )
        self.register_buffer(
            "b_stack",
            torch.zeros(max_loras, out_features, max_rank, dtype=dt, device=dev),
            persistent=False,
        )

    def set_slot(self, slot: int, parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Writes an adapter into ``slot``: ``parts[i] = (A [r, in], B [slice_i, r])`` for the
        slices it targets; the others are zeroed."""
        self.a_stack[slot].zero_()
        self.b_stack[slot].zero_()
        starts = [sum(self.slice_sizes[:i]) for i in range(len(self.slice_sizes))]
        for i, (a, b) in parts.items():
            r = a.shape[0]
            if tuple(a.shape) != (r, self.in_features) or tuple(b.shape) != (
                self.slice_sizes[i],
                r,
            ):
                raise ValueError(
                    f"LoRA weights of {self.slice_names[i]} have shapes A {tuple(a.shape)}, B "
                    f"{tuple(b.shape)}; the layer takes A [r, {self.in_features}] and B "
                    f"[{self.slice_sizes[i]}, r]"
                )
            row = i * self.max_rank
            self.a_stack[slot, row : row + r].copy_(a)
            self.b_stack[slot, starts[i] : starts[i] + self.slice_sizes[i], :r].copy_(b)

    def clear_slot(self, slot: int) -> None:
        self.a_stack[slot].zero_()
        self.b_stack[slot].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        idx = self.step.token_lora_indices
        if idx is None:
            return y
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        buf = ops.lora_shrink(x2, self.a_stack, idx)
        ops.lora_expand(y2, buf, self.b_stack, idx, self.slice_sizes)
        return y


def _slices(name: str, layer: nn.Module) -> tuple[list[str], list[int]]:
    if isinstance(layer, QKVParallelLinear):
        return PACKED_MODULES["qkv_proj"], [layer.q_size, layer.kv_size, layer.kv_size]
    if isinstance(layer, MergedColumnParallelLinear):
        names = PACKED_MODULES.get(name) or [f"{name}.{i}" for i in range(len(layer.output_sizes))]
        return names, list(layer.output_sizes)
    weight: torch.Tensor = layer.weight  # type: ignore[assignment]
    return [name], [int(weight.shape[0])]


@dataclass
class LoRATargets:
    """The LoRA layers of a model: ``by_module[checkpoint module name] = (layer, slice)``."""

    step: LoRAStep
    layers: list[LoRALinear] = field(default_factory=list)
    by_module: dict[str, tuple[LoRALinear, int]] = field(default_factory=dict)


def add_lora_layers(model: nn.Module, max_loras: int, max_rank: int) -> LoRATargets:
    """Wraps every column-/row-parallel linear layer of ``model`` (the LM head and embeddings
    are not among them) in a LoRALinear with ``max_loras`` slots of rank ``max_rank``."""
    if get_tp_group().world_size != 1:
        raise ValueError("enable_lora with tensor_parallel_size > 1 is not supported yet")
    targets = LoRATargets(LoRAStep())
    linear = (ColumnParallelLinear, RowParallelLinear)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, linear)]
    for full, layer in found:
        parent_name, _, name = full.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        names, sizes = _slices(name, layer)
        wrapped = LoRALinear(layer, names, sizes, max_loras, max_rank, targets.step)
        setattr(parent, name, wrapped)
        targets.layers.append(wrapped)
        prefix = f"{parent_name}." if parent_name else ""
        for i, n in enumerate(names):
            targets.by_module[prefix + n] = (wrapped, i)
    return targets
