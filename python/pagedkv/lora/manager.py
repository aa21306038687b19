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
        self.host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # adapter id -> weights, LRU
        self.slots: OrderedDict[int, int] = OrderedDict()  # adapter id -> slot, LRU first
        self.known: dict[int, LoRARequest] = {}  # every adapter added, by id

    # ------------------------------------------------------------------ host side
    def read_adapter(self, request: LoRARequest) -> LoRAAdapter:
        """Reads the adapter folder and checks it against the model, storing nothing (the
        server checks an adapter when it is registered, off the engine thread)."""
        adapter = load_adapter(request.lora_path, self.max_lora_rank)
        for module in adapter.weights:
            if module not in self.targets.by_module:
                raise ValueError(
                    f"LoRA adapter {request.lora_name!r} targets {module!r}, which "
                    "is not a supported linear layer of the model"
                )
        return adapter

    def add_adapter(self, request: LoRARequest) -> None:
        """Reads the adapter into host memory (checked against the model). The host memory is
        a cache of max_cpu_loras adapters: the least recently used one makes room, and is read
        from its folder again when a step needs it and no device slot holds it (as vLLM's
        workers do). Pinning adapters there instead refused every adapter past the first
        max_loras for good once they held the device slots, used or not."""
        known = self.known.get(request.lora_int_id)
        if known is not None and known.lora_path != request.lora_path:
            raise ValueError(
                f"lora_int_id {request.lora_int_id} is already adapter "
                f"{known.lora_name!r} from {known.lora_path!r}"
            )
        if request.lora_int_id in self.host:
            self.host.move_to_end(request.lora_int_id)
            return
        self._cache(request.lora_int_id, self.read_adapter(request))
        self.known[request.lora_int_id] = request

    def _cache(self, lora_int_id: int, adapter: LoRAAdapter) -> LoRAAdapter:
        while len(self.host) >= self.max_cpu_loras:
            self.host.popitem(last=False)
        self.host[lora_int_id] = adapter
        return adapter

    def _host_adapter(self, lora_int_id: int) -> LoRAAdapter:
        """The adapter's weights in host memory, read from its folder again if the host cache
        evicted them."""
        adapter = self.host.get(lora_int_id)
        if adapter is not None:
            return adapter
        request = self.known.get(lora_int_id)
        if request is None:
            raise ValueError(f"LoRA adapter id {lora_int_id} is not loaded")
        return self._cache(lora_int_id, self.read_adapter(request))

    def remove_adapter(self, lora_int_id: int) -> bool:
        slot = self.slots.pop(lora_int_id, None)
        if slot is not None:
            for layer in self.targets.layers:
                layer.clear_slot(slot)
        self.host.pop(lora_int_id, None)
        return self.known.pop(lora_int_id, None) is not None

    def list_adapters(self) -> list[LoRARequest]:
        """Every adapter added and not removed (in host memory or not)."""
        return list(self.known.values())

    # ------------------------------------------------------------------ device slots
    def ensure_readable(self, lora_int_ids: Sequence[int]) -> dict[int, Exception]:
        """Makes every adapter of the next step ready for a device slot: one in neither a slot
        nor host memory is read from its folder again (evicted from the host cache). Returns
        the adapters that could not be read, each with its error, so that the engine fails
        only their requests (a deleted or unreadable folder is theirs, not the step's)."""
        for i in lora_int_ids:  # needed ones first in the LRU: reading others evicts them last
            if i in self.host:
                self.host.move_to_end(i)
        errors: dict[int, Exception] = {}
        for i in lora_int_ids:
            if i in self.slots:
                continue
            try:
                self._host_adapter(i)
            except Exception as exc:
                errors[i] = exc
        return errors

    def _load_slot(self, lora_int_id: int, busy: set[int]) -> int:
        adapter = self._host_adapter(lora_int_id)
        used = set(self.slots.values())
        free = [s for s in range(self.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next(i for i in self.slots if i not in busy)
            slot = self.slots.pop(victim)
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
