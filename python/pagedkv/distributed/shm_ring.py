"""ShmRing: one writer, N readers, a ring of byte slots in shared memory (one node).

The driver publishes each message by copying it into the next slot and then bumping that
slot's sequence number; each reader waits for the number it expects, reads the slot, and
marks it done with its own counter, which the writer checks before reusing the slot. Nothing
else is shared: no lock, no socket, no collective. The counters are aligned int64 stores, and
the payload is written before the sequence number that publishes it (x86 stores are seen in
program order, so a reader that sees the number sees the payload).

The ring needs that ordering (x86's): on other machines (aarch64: loads and stores reorder,
and Python has no fence to put between them) ``ShmRing.ordered()`` is False and the executor
sends its commands by a gloo broadcast instead (command_channel.BroadcastChannel).

A message larger than a slot takes several consecutive slots (the first slot's header says
how many); the reader then gathers it into one buffer.

Waiting: a reader busy-spins for ``spin_s`` (on a GPU the next step's command comes within a
step's host gap), yields its core for a while, then sleeps on its own semaphore after raising
its "sleeping" flag, which the writer checks after each publish to wake it (an idle server
costs no core, and a sleeping reader wakes at once). The flag and the sequence number are a
store then a load on each side, which x86 may reorder: the rare lost wake-up is bounded by the
sleep's timeout (1 ms, growing to 50 ms while idle). Waits check ``alive()`` every ~50 ms and
raise PeerGone when the other side is gone; the writer's wait for a free slot also ends at
``timeout_s``.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import time
from multiprocessing import shared_memory
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

# Per slot header: [sequence number, bytes in this slot, slots of the message, pad].
_HDR = 4
_CHECK_EVERY_S = 0.05
_YIELD_S = 2e-4


class PeerGone(RuntimeError):
    """The other side of the ring stopped (its process is gone)."""


class ShmRing:
    def __init__(
        self,
        shm: shared_memory.SharedMemory,
        num_readers: int,
        num_slots: int,
        slot_bytes: int,
        wakeups: List[Any],
        owner: bool,
    ) -> None:
        self.shm, self.owner, self.wakeups = shm, owner, wakeups
        self.num_readers, self.num_slots, self.slot_bytes = num_readers, num_slots, slot_bytes
        # The views own the mapping: frombuffer holds a buffer export of the mmap (np.ndarray(
        # buffer=) does not), and SharedMemory no longer closes it, so the mmap's own dealloc
        # unmaps it when the last view goes, never under one that is still referenced (a
        # traceback's frame, a thread still in write(): touching it would be a segfault).
        assert shm.buf is not None  # (an open segment)
        buf = np.frombuffer(shm.buf, dtype=np.uint8)
        shm._mmap = None  # type: ignore[attr-defined]
        n_hdr = num_slots * _HDR
        self.hdr = buf[: 8 * n_hdr].view(np.int64).reshape(num_slots, _HDR)
        done_end = 8 * (n_hdr + num_slots * num_readers)
        self.done = buf[8 * n_hdr : done_end].view(np.int64).reshape(num_slots, num_readers)
        self.sleeping = buf[done_end : done_end + 8 * num_readers].view(np.int64)
        data_start = done_end + 8 * num_readers
        data = buf[data_start : data_start + num_slots * slot_bytes]
        self.slots = [data[i * slot_bytes : (i + 1) * slot_bytes] for i in range(num_slots)]
        self.seq = 0  # the writer's last sequence number, or the reader's last read
        self.reader = -1  # this reader's index (attach())

    @staticmethod
    def ordered() -> bool:
        """Whether this machine sees each process' stores in program order (x86's TSO), which
        the ring's publish / read protocol relies on."""
        return platform.machine().lower() in ("x86_64", "amd64")  # (not 32-bit: int64 stores tear)

    @classmethod
    def create(cls, num_readers: int, num_slots: int = 4, slot_bytes: int = 1 << 20) -> ShmRing:
        """The writer's end; readers attach in processes it spawns (the handle carries
        semaphores, which only spawning can hand over)."""
        slot_bytes = (slot_bytes + 7) & ~7
        counters = 8 * (num_slots * (_HDR + num_readers) + num_readers)
        # (A new segment reads as zeros: every counter starts at 0.)
        shm = shared_memory.SharedMemory(create=True, size=counters + num_slots * slot_bytes)
        ctx = multiprocessing.get_context("spawn")
        wakeups = [ctx.Semaphore(0) for _ in range(num_readers)]
        return cls(shm, num_readers, num_slots, slot_bytes, wakeups, owner=True)

    @property
    def handle(self) -> Tuple[Any, ...]:
        """What a reader process needs to attach (an argument of the spawned process)."""
        return (self.shm.name, self.num_readers, self.num_slots, self.slot_bytes, self.wakeups)

    @classmethod
    def attach(cls, handle: Tuple[Any, ...], reader: int) -> ShmRing:
        name, num_readers, num_slots, slot_bytes, wakeups = handle
        # (A spawned process shares its parent's resource tracker: the name stays registered
        # once, and the creator's unlink() unregisters it.)
        shm = shared_memory.SharedMemory(name=name)
        ring = cls(shm, num_readers, num_slots, slot_bytes, wakeups, owner=False)
        ring.reader = reader
        return ring

    # ------------------------------------------------------------------ writer
    def acquire(self, alive: Callable[[], bool], timeout_s: float) -> np.ndarray:
        """The next slot's buffer, once every reader is done with its previous message."""
        seq = self.seq + 1
        i = (seq - 1) % self.num_slots
        prev = seq - self.num_slots  # the message this slot held last (<= 0: none)
        done = self.done[i]
        if prev > 0 and int(done.min()) < prev:
            _wait(lambda: int(done.min()) >= prev, alive, timeout_s, "a worker to read")
        return self.slots[i]

    def publish(self, nbytes: int, num_slots: int = 1) -> None:
        """Publishes the slot acquire() returned, holding ``nbytes`` of a message that takes
        ``num_slots`` slots in all (the first one's header carries the count)."""
        self.seq += 1
        h = self.hdr[(self.seq - 1) % self.num_slots]
        h[1], h[2] = nbytes, num_slots
        h[0] = self.seq  # last: publishes the slot
        # A copy first: the readers flip their flags meanwhile, and numpy's nonzero counts,
        # then fills, raising (or worse) when the count moved in between.
        for r, asleep in enumerate(self.sleeping.tolist()):
            if asleep:
                self.wakeups[r].release()

    def write(
        self,
        nbytes: int,
        fill: Callable[[np.ndarray], None],
        alive: Callable[[], bool],
        timeout_s: float,
    ) -> None:
        """Writes one message of ``nbytes``: ``fill(buf)`` writes it into a buffer (the slot
        itself when it fits, else a scratch buffer copied over consecutive slots)."""
        if nbytes <= self.slot_bytes:
            fill(self.acquire(alive, timeout_s)[:nbytes])
            self.publish(nbytes)
            return
        scratch = np.empty(nbytes, dtype=np.uint8)
        fill(scratch)
        count = -(-nbytes // self.slot_bytes)
        for k in range(count):
            part = scratch[k * self.slot_bytes : (k + 1) * self.slot_bytes]
            self.acquire(alive, timeout_s)[: part.nbytes] = part
            self.publish(part.nbytes, count if k == 0 else 0)

    # ------------------------------------------------------------------ reader
    def read(
        self,
        use: Callable[[np.ndarray], Any],
        alive: Callable[[], bool],
        spin_s: float,
        timeout_s: Optional[float] = None,
    ) -> Any:
        """``use(buf)`` on the next message (a view of the slot, valid only during the call);
        returns what it returns."""
        buf, count = self._next(alive, spin_s, timeout_s)
        if count == 1:
            try:
                return use(buf)
            finally:
                self._release()
        parts = [buf.copy()]
        self._release()
        for _ in range(count - 1):
            parts.append(self._next(alive, spin_s, timeout_s)[0].copy())
            self._release()
        return use(np.concatenate(parts))

    def _next(
        self, alive: Callable[[], bool], spin_s: float, timeout_s: Optional[float]
    ) -> Tuple[np.ndarray, int]:
        seq = self.seq + 1
        i = (seq - 1) % self.num_slots
        h = self.hdr[i]
        if int(h[0]) != seq:
            self._wait(lambda: int(h[0]) == seq, alive, timeout_s, spin_s)
        return self.slots[i][: int(h[1])], int(h[2])

    def _wait(
        self,
        ready: Callable[[], bool],
        alive: Callable[[], bool],
        timeout_s: Optional[float],
        spin_s: float,
    ) -> None:
        start = time.monotonic()
        while time.monotonic() - start < spin_s:
            if ready():
                return
        while time.monotonic() - start < spin_s + _YIELD_S:
            if ready():
                return
            os.sched_yield()
        flag, wakeup = self.sleeping[self.reader : self.reader + 1], self.wakeups[self.reader]
        nap, check = 1e-3, time.monotonic() + _CHECK_EVERY_S
        while True:
            flag[0] = 1
            if ready():
                break
            wakeup.acquire(timeout=nap)
            flag[0] = 0
            if ready():
                break
            nap = min(2 * nap, _CHECK_EVERY_S)
            now = time.monotonic()
            if now > check:
                check = now + _CHECK_EVERY_S
                _check(alive, timeout_s, now - start, "the driver's command")
        flag[0] = 0

    def _release(self) -> None:
        self.seq += 1
        self.done[(self.seq - 1) % self.num_slots, self.reader] = self.seq

    def close(self) -> None:
        """Drops this ring's views (the segment is unmapped with the last view of it, at once
        when no other is referenced) and closes its descriptor; the owner unlinks the name."""
        self.hdr = self.done = self.sleeping = None  # type: ignore[assignment]
        self.slots = []
        self.shm.close()
        if self.owner:
            self.shm.unlink()


def _wait(
    ready: Callable[[], bool], alive: Callable[[], bool], timeout_s: Optional[float], what: str
) -> None:
    """The writer's wait for a free slot (readers free slots within a step: rare, short)."""
    start = time.monotonic()
    check = start + _CHECK_EVERY_S
    nap = 1e-5
    while not ready():
        time.sleep(nap)
        nap = min(2 * nap, 1e-3)
        now = time.monotonic()
        if now > check:
            check = now + _CHECK_EVERY_S
            _check(alive, timeout_s, now - start, what)


def _check(alive: Callable[[], bool], timeout_s: Optional[float], waited: float, what: str) -> None:
    if not alive():
        raise PeerGone(f"gave up waiting for {what}: the other side is gone")
    if timeout_s is not None and waited > timeout_s:
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
