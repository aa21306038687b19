"""LoRAManager: adapters kept in host memory (LRU, at most max_cpu_loras) and copied into the
model's max_loras device slots on demand (LRU among the slots no token of the step uses)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

import numpy as np
import torch
from torch import nn

from pagedkv.lora.adapter import LoRAAdapter, load_adapter
from pagedkv.lora.request import LoRARequest
from pagedkv.models.lora import LoRATargets, add_lora_layers


class LoRAManager:
    def __init__(
        self,
        model: nn.Module,
        max_loras: int,
        max_lora_rank: int,
        max_cpu_loras: Optional[int] = None,
        kernel: str = "auto",
    ) -> None:
        """``kernel``: how the layers apply the deltas, one of models/lora.py's LORA_KERNELS."""
        if max_loras < 1 or max_lora_rank < 1:
            raise ValueError(
                f"max_loras ({max_loras}) and max_lora_rank ({max_lora_rank}) must be positive"
            )
        max_cpu_loras = max_loras if max_cpu_loras is None else max_cpu_loras
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
        self.max_loras, self.max_lora_rank, self.max_cpu_loras = (
            max_loras,
            max_lora_rank,
            max_cpu_loras,
        )
        self.targets: LoRATargets = add_lora_layers(model, max_loras, max_lora_rank, kernel)
        self.device = next(model.parameters()).device
        self.host: OrderedDict[int, tuple[LoRARequest, LoRAAdapter]] = OrderedDict()
        self.slots: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, LRU first

    # ------------------------------------------------------------------ host side
    def add_adapter(self, request: LoRARequest) -> None:
        """Reads the adapter into host memory (checked against the model), evicting the least
        recently used host adapter that holds no slot when max_cpu_loras are loaded."""
        known = self.host.get(request.lora_int_id)
        if known is not None:
            if known[0].lora_path != request.lora_path:
                raise ValueError(
                    f"lora_int_id {request.lora_int_id} is already adapter "
                    f"{known[0].lora_name!r} from {known[0].lora_path!r}"
                )
            self.host.move_to_end(request.lora_int_id)
            return
        adapter = load_adapter(request.lora_path, self.max_lora_rank)
        for module in adapter.weights:
            if module not in self.targets.by_module:
                raise ValueError(
                    f"LoRA adapter {request.lora_name!r} targets {module!r}, which "
                    "is not a supported linear layer of the model"
                )
        while len(self.host) >= self.max_cpu_loras:
            victim = next((i for i in self.host if i not in self.slots), None)
            if victim is None:
                raise ValueError(
                    f"max_cpu_loras = {self.max_cpu_loras} adapters are loaded and "
                    "all are in device slots"
                )
            del self.host[victim]
        self.host[request.lora_int_id] = (request, adapter)

    def remove_adapter(self, lora_int_id: int) -> bool:
        slot = self.slots.pop(lora_int_id, None)
        if slot is not None:
            for layer in self.targets.layers:
                layer.clear_slot(slot)
        return self.host.pop(lora_int_id, None) is not None

    def list_adapters(self) -> list[LoRARequest]:
        return [req for req, _ in self.host.values()]

    # ------------------------------------------------------------------ device slots
    def _load_slot(self, lora_int_id: int, busy: set[int]) -> int:
        if lora_int_id not in self.host:
            raise ValueError(f"LoRA adapter id {lora_int_id} is not loaded")
        used = set(self.slots.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(i for i in self.slots if i not in busy)
            slot = self.slots.pop(victim)
        _, adapter = self.host[lora_int_id]
        per_layer: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        by_layer = {id(layer): layer for layer in self.targets.layers}
        for module, (a, b) in adapter.weights.items():
            layer, i = self.targets.by_module[module]
            per_layer.setdefault(id(layer), {})[i] = (a, b)
        for key, layer in by_layer.items():
            layer.set_slot(slot, per_layer.get(key, {}))
        self.slots[lora_int_id] = slot
        return slot

    def prepare_step(self, token_adapter_ids: Sequence[int] | np.ndarray) -> Optional[np.ndarray]:
        """Sets the slot of every token of the next forward (adapter id per token, 0 = none),
        loading adapters into slots as needed; returns those slots (int32, -1 = no adapter),
        or None when no token has an adapter. A CUDA graph reads them from its own buffer.
        Per distinct adapter, not per token, in Python: this runs every step."""
        ids = np.asarray(token_adapter_ids, dtype=np.int64).reshape(-1)
        distinct = sorted(set(ids.tolist()))  # (a set is faster than np.unique here)
        wanted = [i for i in distinct if i]
        if len(wanted) > self.max_loras:
            raise ValueError(
                f"a step uses {len(wanted)} adapters but max_loras is {self.max_loras}"
            )
        if not wanted:
            self.targets.step.token_lora_indices = None
            return None
        busy = set(wanted)
        slot_of = {0: -1}
        for i in wanted:
            if i in self.slots:
                self.slots.move_to_end(i)
                slot_of[i] = self.slots[i]
            else:
                slot_of[i] = self._load_slot(i, busy)
            if i in self.host:  # (audit3's host cache may have dropped an adapter in a slot)
                self.host.move_to_end(i)
        lut = np.array([slot_of[i] for i in distinct], dtype=np.int32)
        slots = lut[np.searchsorted(np.array(distinct, dtype=np.int64), ids)]
        # Copied to the device only if a layer reads them (not when a CUDA graph replays).
        self.targets.step.set_host_slots(slots, self.device)
        return slots

    def end_step(self) -> None:
        self.targets.step.token_lora_indices = None
