"""LoRA layers: a linear layer of models/linear.py wrapped so that each token of a step adds the
low-rank delta of its own adapter, ``y[t] += (x[t] A_l^T) B_l^T`` with l = the token's slot, for
all adapters of the step in one shrink and one expand.

Fused layers hold one slice per projection of the checkpoint (qkv_proj: q/k/v, gate_up_proj:
gate/up); an adapter's A matrices of the slices are stacked into one shrink, and each output
column reads its own slice's part of the shrunk row. The slots' weights live in ``a_stack``
[max_loras + 1, slices * max_rank, in] and ``b_stack`` [max_loras + 1, out, slices * max_rank],
block-diagonal: slice i's output rows are zero outside its rank columns i * max_rank ..., so
one expand serves all slices. A smaller rank is zero-padded, a slice the adapter does not
target stays zero, and the last slot stays all zero (tokens without an adapter, see
LoRAStep.groups).

Four kernels (``kernel``, one of LORA_KERNELS): "pagedkv", the core's BGMV ops
(pagedkv.ops.lora_shrink / lora_expand, every device and dtype: each token reads its adapter's
weights); "pagedkv_tiled", the same ops' tiled CUDA variant (pagedkv/lora_ops.py);
"grouped_mm", punica's SGMV through torch._grouped_mm (CUTLASS grouped GEMM, bf16 on Hopper):
the step's tokens sorted by slot, one GEMM over each slot's run of rows; and "dense": one GEMM
of the tokens against ALL slots' A matrices, the rows of other slots zeroed by the step's
one-hot slot mask, and one GEMM against all slots' B matrices that adds into the base output
in place (beta = 1). Dense does max_loras times the shrink/expand FLOPs of the others, but it
reads each slot's weights once, with no sort, gather or scatter: three library launches per
layer; its extra bytes and FLOPs are max_loras * ranks * (in + out) against the base layer's
in * out (~14 % for 8 rank-16 adapters on a 1B Llama's layers). "auto" (auto_kernel) takes dense
on CUDA while those extra bytes stay within DENSE_MAX_EXTRA of the layer's, else grouped_mm where
it applies, else the core's kernels. Measured on an H200 (RESULTS.md, "LoRA"; 8 rank-16
adapters, ~1B Llama, 256 requests): adapter steps at 0.70x the base model's tokens/s with dense,
0.42x grouped_mm, 0.30x pagedkv_tiled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
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


LORA_KERNELS = ("auto", "pagedkv", "pagedkv_tiled", "grouped_mm", "dense")
# "auto" takes dense while all slots' A and B add at most this share of the layer's own weight
# bytes. Measured up to 0.31 (a 1B Llama's qkv_proj with 8 rank-16 slots), where dense still ran
# 2-3x faster than grouped_mm per layer; the bound allows a little more, not measured.
DENSE_MAX_EXTRA = 0.5


class LoRAStep:
    """The adapters of the step under way, shared by every LoRA layer of a model: the slot of
    each token (int32 [T] on the model's device, -1 = no adapter) or None when no token of the
    step has an adapter (the layers then add nothing).

    What the kernels derive from the slots is computed once per forward, by the first layer
    that asks, on the device (no host sync, so a CUDA graph captures it and recomputes it from
    its slot buffer on each replay), and reused by the later layers: the grouping by slot
    (grouped_mm) and the one-hot slot mask (dense). Setting ``token_lora_indices`` drops them:
    set them before each forward, also when they are the same tensor (a graph's capture runs a
    warm-up forward first). ``set_host_slots`` defers the host -> device copy of the slots to
    the first layer that reads them, so a step replayed from a CUDA graph (which reads its own
    slot buffer) never pays it."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._indices: Optional[torch.Tensor] = None
        self._host: Optional[tuple[np.ndarray, torch.device]] = None
        self._groups: Optional[tuple[torch.Tensor, torch.Tensor]] = None
        self._masks: dict[torch.dtype, torch.Tensor] = {}

    @property
    def token_lora_indices(self) -> Optional[torch.Tensor]:
        if self._indices is None and self._host is not None:
            slots, device = self._host
            self._indices, self._host = torch.from_numpy(slots).to(device), None
        return self._indices

    @token_lora_indices.setter
    def token_lora_indices(self, indices: Optional[torch.Tensor]) -> None:
        self._indices, self._host, self._groups = indices, None, None
        self._masks = {}

    def set_host_slots(self, slots: np.ndarray, device: torch.device) -> None:
        """The step's slots (int32 [T], -1 = none) on the host, copied to ``device`` when a
        layer first reads them."""
        self.token_lora_indices = None
        self._host = (np.ascontiguousarray(slots, dtype=np.int32), device)

    def _device_indices(self) -> torch.Tensor:
        idx = self.token_lora_indices
        assert idx is not None, "a step without adapters has no grouping or mask"
        return idx

    def groups(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, offs)``: the step's token rows sorted by slot (stable; tokens without an
        adapter last, as slot max_loras, whose weights are zero) and each slot's end row in
        that order (int32 [max_loras + 1], the last = T): torch._grouped_mm's offsets."""
        if self._groups is None:
            idx = self._device_indices()
            key = torch.where(idx < 0, self.max_loras, idx).long()
            slot_of, order = torch.sort(key, stable=True)
            # Not a bincount: on CUDA it reads the max on the host, which a graph cannot capture.
            slots = torch.arange(self.max_loras + 1, device=idx.device)
            offs = torch.searchsorted(slot_of, slots, right=True).to(torch.int32)
            self._groups = (order, offs)
        return self._groups

    def slot_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """``mask [T, max_loras, 1]`` of ``dtype``: 1 where the token's slot is that slot (all
        zero for tokens without an adapter)."""
        mask = self._masks.get(dtype)
        if mask is None:
            idx = self._device_indices()
            # Not F.one_hot: on CUDA it checks the indices' range on the host (a sync).
            slots = torch.arange(self.max_loras, device=idx.device, dtype=idx.dtype)
            mask = (idx.unsqueeze(1) == slots).to(dtype).unsqueeze(2)
            self._masks[dtype] = mask
        return mask


def grouped_mm_applies(weight: torch.Tensor, ranks: int) -> bool:
    """torch._grouped_mm's conditions for a layer of ``weight`` [out, in] whose shrunk rows are
    ``ranks`` wide: a CUDA bf16 problem on sm90+, every row 16-byte aligned."""
    out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
    return (
        hasattr(torch, "_grouped_mm")
        and weight.is_cuda
        and weight.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(weight.device) >= (9, 0)
        and in_features % 8 == 0
        and out_features % 8 == 0
        and ranks % 8 == 0
    )


def auto_kernel(weight: torch.Tensor, ranks: int, max_loras: int) -> str:
    """What kernel="auto" runs for a layer of ``weight`` [out, in] (the module docstring)."""
    out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
    extra = max_loras * ranks * (in_features + out_features)
    if weight.is_cuda and extra <= DENSE_MAX_EXTRA * in_features * out_features:
        return "dense"
    return "grouped_mm" if grouped_mm_applies(weight, ranks) else "pagedkv"


def _check_grouped_mm(weight: torch.Tensor, ranks: int) -> None:
    """Refuses kernel="grouped_mm" where torch cannot run it graph-safe: off the fast path,
    CUDA's torch._grouped_mm falls back to per-group GEMMs that read the offsets on the host (a
    sync, which a CUDA graph cannot capture). The CPU version serves tests."""
    if not hasattr(torch, "_grouped_mm"):
        raise ValueError(
            f"LoRA kernel 'grouped_mm' needs torch._grouped_mm (torch {torch.__version__})"
        )
    if weight.is_cuda and not grouped_mm_applies(weight, ranks):
        raise ValueError(
            "LoRA kernel 'grouped_mm' on CUDA needs bfloat16 weights on sm90+ and dimensions "
            f"divisible by 8 (layer {tuple(weight.shape)} {weight.dtype}, slices * max_rank = "
            f"{ranks}); use 'pagedkv' or 'auto'"
        )


class LoRALinear(nn.Module):
    """``base`` (a column-, row-, QKV- or merged-parallel linear) plus the adapters' deltas.

    ``b_stack`` [max_loras + 1, out, ranks] is a view of the stored B weights: the dense
    kernel stores them as [max_loras + 1, ranks, out] (``b_store``), so that all slots' B read
    as one [max_loras * ranks, out] matrix without a copy."""

    a_stack: torch.Tensor
    b_store: torch.Tensor

    def __init__(
        self,
        base: nn.Module,
        slice_names: list[str],
        slice_sizes: list[int],
        max_loras: int,
        max_rank: int,
        step: LoRAStep,
        kernel: str = "auto",
    ) -> None:
        super().__init__()
        if kernel not in LORA_KERNELS:
            raise ValueError(f"LoRA kernel must be one of {LORA_KERNELS}, got {kernel!r}")
        self.base = base
        self.slice_names, self.slice_sizes = slice_names, slice_sizes
        self.max_loras, self.max_rank, self.step = max_loras, max_rank, step
        weight: torch.Tensor = base.weight  # type: ignore[assignment]
        out_features, in_features = int(weight.shape[0]), int(weight.shape[1])
        self.in_features = in_features
        ranks = len(slice_names) * max_rank
        if kernel == "grouped_mm":
            _check_grouped_mm(weight, ranks)
        if kernel == "auto":
            kernel = auto_kernel(weight, ranks, max_loras)
        self.kernel = kernel
        dt, dev = weight.dtype, weight.device
        # One more slot than max_loras: the all-zero slot of tokens without an adapter.
        self.register_buffer(
            "a_stack",
            torch.zeros(max_loras + 1, ranks, in_features, dtype=dt, device=dev),
            persistent=False,
        )
        b_shape = (ranks, out_features) if kernel == "dense" else (out_features, ranks)
        self.register_buffer(
            "b_store", torch.zeros(max_loras + 1, *b_shape, dtype=dt, device=dev), persistent=False
        )

    @property
    def b_stack(self) -> torch.Tensor:
        """The slots' B [max_loras + 1, out, ranks] (a view of ``b_store``)."""
        return self.b_store.transpose(1, 2) if self.kernel == "dense" else self.b_store

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.max_loras:
            raise ValueError(f"LoRA slot {slot} is out of range [0, {self.max_loras})")

    def set_slot(self, slot: int, parts: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Writes an adapter into ``slot``: ``parts[i] = (A [r, in], B [slice_i, r])`` for the
        slices it targets; the others are zeroed."""
        self.clear_slot(slot)
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
            rows = slice(starts[i], starts[i] + self.slice_sizes[i])
            self.b_stack[slot, rows, row : row + r].copy_(b)

    def clear_slot(self, slot: int) -> None:
        self._check_slot(slot)
        self.a_stack[slot].zero_()
        self.b_stack[slot].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        idx = self.step.token_lora_indices
        if idx is None:
            return y
        x2, y2 = x.reshape(-1, x.shape[-1]), y.view(-1, y.shape[-1])
        if self.kernel == "dense":
            return self._dense(x2, y2, y)
        if self.kernel == "grouped_mm":
            order, offs = self.step.groups()
            buf = torch._grouped_mm(x2[order], self.a_stack.transpose(1, 2), offs=offs)
            delta = torch._grouped_mm(buf, self.b_stack.transpose(1, 2), offs=offs)
            y2.index_add_(0, order, delta)  # order is a permutation: no two rows collide
            return y
        # The core's expand reads the block-diagonal B as one slice of rank slices * max_rank
        # (the zeros outside a column's own slice add nothing).
        a, b = self.a_stack[: self.max_loras], self.b_stack[: self.max_loras]
        tiled = self.kernel == "pagedkv_tiled"
        buf = ops.lora_shrink(x2, a, idx, tiled=tiled)
        ops.lora_expand(y2, buf, b, idx, tiled=tiled)
        return y

    def _dense(self, x2: torch.Tensor, y2: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y2 += ((x2 A_all^T) * mask) B_all^T over all max_loras slots: the shrink row of each
        token keeps only its own slot's columns, so the expand adds only its own adapter."""
        n, ranks = self.max_loras, int(self.a_stack.shape[1])
        a_all = self.a_stack[:n].reshape(n * ranks, self.in_features)  # views, no copies
        b_all = self.b_store[:n].reshape(n * ranks, y2.shape[1])
        buf = torch.mm(x2, a_all.t())
        buf.view(-1, n, ranks).mul_(self.step.slot_mask(buf.dtype))
        y2.addmm_(buf, b_all)  # beta = 1: the base output is the GEMM's C, summed in fp32
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


def add_lora_layers(
    model: nn.Module, max_loras: int, max_rank: int, kernel: str = "auto"
) -> LoRATargets:
    """Wraps every column-/row-parallel linear layer of ``model`` (the LM head and embeddings
    are not among them) in a LoRALinear with ``max_loras`` slots of rank ``max_rank`` whose
    deltas run through ``kernel`` (one of LORA_KERNELS)."""
    if get_tp_group().world_size != 1:
        raise ValueError("enable_lora with tensor_parallel_size > 1 is not supported yet")
    targets = LoRATargets(LoRAStep(max_loras))
    linear = (ColumnParallelLinear, RowParallelLinear)
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, linear)]
    for full, layer in found:
        parent_name, _, name = full.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        names, sizes = _slices(name, layer)
        wrapped = LoRALinear(layer, names, sizes, max_loras, max_rank, targets.step, kernel)
        setattr(parent, name, wrapped)
        targets.layers.append(wrapped)
        prefix = f"{parent_name}." if parent_name else ""
        for i, n in enumerate(names):
            targets.by_module[prefix + n] = (wrapped, i)
    return targets
