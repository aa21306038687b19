"""LoRAAdmission: keeps the requests the scheduler holds to at most max_loras distinct adapters,
so that no step can need more adapters than the device has slots (the C++ scheduler does not
know adapters). A request whose adapter would be one too many waits here, in arrival order, until
the last request of a resident adapter leaves."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any


class LoRAAdmission:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.resident: Counter[int] = Counter()  # adapter id -> requests in the scheduler
        self.waiting: deque[tuple[int, str, Any]] = deque()  # (adapter id, key, item) in order

    def _fits(self, lora_id: int) -> bool:
        return lora_id == 0 or lora_id in self.resident or len(self.resident) < self.max_loras

    def admit(self, lora_id: int, key: str, item: Any) -> bool:
        """True if the request may go to the scheduler now (then counted as resident); False
        if it waits (``item`` is returned later by release()). A new adapter also waits behind
        earlier waiting requests, so that they are not starved."""
        if (self.waiting and lora_id != 0 and lora_id not in self.resident) or not self._fits(
            lora_id
        ):
            self.waiting.append((lora_id, key, item))
            return False
        if lora_id:
            self.resident[lora_id] += 1
        return True

    def release(self, lora_id: int) -> list[Any]:
        """A resident request with adapter ``lora_id`` left the scheduler: the waiting requests
        that fit now, in order (counted as resident)."""
        if lora_id:
            self.resident[lora_id] -= 1
            if self.resident[lora_id] <= 0:
                del self.resident[lora_id]
        admitted = []
        while self.waiting and self._fits(self.waiting[0][0]):
            lid, _, item = self.waiting.popleft()
            if lid:
                self.resident[lid] += 1
            admitted.append(item)
        return admitted

    def drop(self, key: str) -> bool:
        """Removes a waiting request (aborted before it was admitted); False if none waits."""
        for i, (_, k, _) in enumerate(self.waiting):
            if k == key:
                del self.waiting[i]
                return True
        return False
