"""LoRA adapters: requests naming a PEFT adapter folder (request.py), the adapters' weights
(adapter.py), the layers that add their deltas (models/lora.py) and the slots they occupy on the
device (manager.py)."""

from pagedkv.lora.request import LoRARequest

__all__ = ["LoRARequest"]
