"""How the driver's commands (worker.py's methods and their arguments) reach the other ranks.

Both carriers send command_codec's flat bytes, never pickles:

ShmChannel: one node, the driver spawned the workers, an x86 machine (ShmRing.ordered()). The
command goes through a shared-memory ring (distributed/shm_ring.py): the driver copies it in
(one memcpy per array) and goes on, the workers wait on the slot's sequence number. No
collective, no round trip.

BroadcastChannel: torchrun (multi-node: the ranks may not share memory), and spawned workers
on machines whose stores the ring cannot order (aarch64). One broadcast of a fixed-size flat
uint8 buffer over the world's gloo group (a second one only for a command larger than the
buffer). Not NCCL, on purpose: idle workers wait in this broadcast for as long as the engine
is idle, so its group has no timeout worth the name, and a driver that dies leaves an NCCL
collective waiting forever, where gloo's sockets close and the workers end. At
multi-node step times (tens of ms) one gloo broadcast per command is well under 1 %.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from pagedkv.distributed import GroupCoordinator
from pagedkv.distributed.shm_ring import ShmRing
from pagedkv.engine import command_codec

Command = Tuple[str, Tuple[Any, ...]]

# A step's plan at 256 sequences x 2 k-token block tables is ~140 KB; one slot holds it.
_SLOT_BYTES = 1 << 20
_NUM_SLOTS = 4


class ShmChannel:
    def __init__(self, ring: ShmRing, alive: Callable[[], bool], spin_s: float) -> None:
        self.ring, self.alive, self.spin_s = ring, alive, spin_s
        self.timeout_s = 600.0

    @classmethod
    def create(cls, num_readers: int, timeout_s: float = 600.0) -> ShmChannel:
        """The driver's end; ``alive`` (set by the owner) says whether the workers still run,
        ``timeout_s`` bounds the wait for a free slot."""
        chan = cls(ShmRing.create(num_readers, _NUM_SLOTS, _SLOT_BYTES), lambda: True, 0.0)
        chan.timeout_s = timeout_s
        return chan

    @property
    def handle(self) -> Tuple[Any, ...]:
        return self.ring.handle

    @classmethod
    def attach(
        cls,
        handle: Tuple[Any, ...],
        reader: int,
        alive: Callable[[], bool],
        spin_s: float = 0.0,
    ) -> ShmChannel:
        """Worker ``reader``'s end (0-based among the workers); ``alive()`` says whether the
        driver still runs; ``spin_s``: how long a wait busy-spins before it yields the core."""
        return cls(ShmRing.attach(handle, reader), alive, spin_s)

    def send(self, name: str, args: Sequence[Any]) -> None:
        nbytes, pieces = command_codec.encode(name, args)
        self.ring.write(
            nbytes, lambda buf: command_codec.write(buf, pieces), self.alive, self.timeout_s
        )

    def recv(self) -> Command:
        return self.ring.read(command_codec.decode, self.alive, self.spin_s)

    def close(self) -> None:
        self.ring.close()


class BroadcastChannel:
    """Every rank builds one (same arguments); rank 0 sends, the others receive."""

    CAPACITY = 1 << 16  # bytes of the first broadcast: a decode step's plan up to ~100 seqs

    def __init__(self, group: GroupCoordinator) -> None:
        self.src, self.pg = group.ranks[0], group.cpu_group
        self.buf = torch.empty(self.CAPACITY, dtype=torch.uint8)
        self.buf_np = self.buf.numpy()

    def _broadcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, src=self.src, group=self.pg)

    def send(self, name: str, args: Sequence[Any]) -> None:
        nbytes, pieces = command_codec.encode(name, args)
        # 8 bytes of length, then the command; what does not fit goes in a second broadcast.
        total = 8 + nbytes
        flat = self.buf_np if total <= self.CAPACITY else np.empty(total, np.uint8)
        flat[:8].view(np.int64)[0] = nbytes
        command_codec.write(flat[8:], pieces)
        if flat is not self.buf_np:
            self.buf_np[:] = flat[: self.CAPACITY]
        self._broadcast(self.buf)
        if total > self.CAPACITY:
            self._broadcast(torch.from_numpy(flat[self.CAPACITY :]))

    def recv(self) -> Command:
        self._broadcast(self.buf)
        head = self.buf_np
        total = 8 + int(head[:8].view(np.int64)[0])
        if total <= self.CAPACITY:
            return command_codec.decode(head[8:total])
        rest = torch.empty(total - self.CAPACITY, dtype=torch.uint8)
        self._broadcast(rest)
        return command_codec.decode(np.concatenate([head, rest.numpy()])[8:])

    def close(self) -> None:
        pass
