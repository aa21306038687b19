"""The driver's commands to the workers: the flat codec and the shared-memory ring (in one
process, a thread writing; the multi-process engine paths are test_engine_parallel.py's)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import numpy as np
import pytest
from support.deps import need

need("torch")

from pagedkv.distributed.shm_ring import PeerGone, ShmRing  # noqa: E402
from pagedkv.engine import command_codec  # noqa: E402
from pagedkv.engine.plan_arrays import PlanArrays  # noqa: E402


def _plan(batch: int, width: int, seed: int) -> PlanArrays:
    g = np.random.default_rng(seed)
    return PlanArrays(
        step=seed,
        num_seqs=batch,
        num_prefills=1,
        num_prefill_tokens=5,
        num_decode_tokens=batch - 1,
        num_tokens=batch + 4,
        max_query_len=5,
        max_decode_seq_len=-(2**40),
        input_ids=g.integers(0, 1000, batch + 4).astype(np.int32),
        positions=g.integers(0, 1 << 40, batch + 4),
        slot_mapping=g.integers(-1, 1 << 20, batch + 4),
        seq_lens=g.integers(1, 100, batch).astype(np.int32),
        query_start_loc=np.arange(batch + 1, dtype=np.int32),
        block_tables=g.integers(0, 1 << 16, (batch, width)).astype(np.int32),
        blocks_to_swap_out=g.integers(0, 9, (3, 2)),
        blocks_to_swap_in=np.zeros((0, 2), np.int64),
        blocks_to_copy=g.integers(0, 9, (1, 2)),
    )


def _roundtrip(name: str, args: tuple) -> tuple:
    nbytes, pieces = command_codec.encode(name, args)
    buf = np.full(nbytes + 16, 0xAB, dtype=np.uint8)  # junk past the end must not matter
    command_codec.write(buf, pieces)
    return command_codec.decode(buf)


def _assert_same(a: object, b: object) -> None:
    if isinstance(a, PlanArrays):
        assert isinstance(b, PlanArrays)
        for k in a.__dataclass_fields__:
            _assert_same(getattr(a, k), getattr(b, k))
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert type(a) is type(b) and a == b, (a, b)


def test_codec_round_trips_every_value_kind() -> None:
    args = (
        None,
        True,
        False,
        0,
        -(2**62),
        -1.5e-300,
        "naïve",
        np.zeros((0, 2), np.int64),
        np.arange(12, dtype=np.float16).reshape(3, 4)[:, ::2],  # not contiguous
        np.array(7, dtype=np.uint8),
        [1, (2.0, np.ones(3, dtype=bool))],
        _plan(5, 3, 1),
    )
    name, got = _roundtrip("execute", args)
    assert name == "execute"
    _assert_same(args, got)


def test_codec_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(TypeError, match="cannot carry dict"):
        command_codec.encode("x", ({"a": 1},))
    with pytest.raises(TypeError, match="cannot carry complex128 arrays"):
        command_codec.encode("x", (np.zeros(2, np.complex128),))


def test_ring_carries_messages_in_order_through_wraparound_and_overflow() -> None:
    """More messages than slots (slots are reused once the reader is done), some larger than
    a slot (split over consecutive slots), the writer running ahead of the reader."""
    ring = ShmRing.create(num_readers=1, num_slots=3, slot_bytes=4096)
    reader = ShmRing.attach(ring.handle, 0)
    plans = [_plan(b, w, i) for i, (b, w) in enumerate([(1, 1), (64, 40), (2, 2)] * 6)]
    assert any(command_codec.encode("e", (p,))[0] > 4096 for p in plans)

    def write_all() -> None:
        for p in plans:
            nbytes, pieces = command_codec.encode("execute", (p,))
            fill = lambda buf, pieces=pieces: command_codec.write(buf, pieces)  # noqa: E731
            ring.write(nbytes, fill, lambda: True, 10)

    writer = threading.Thread(target=write_all)
    writer.start()
    try:
        for want in plans:
            time.sleep(0.001)  # the writer gets ahead and must wait for free slots
            name, (got,) = reader.read(command_codec.decode, lambda: True, spin_s=0.0)
            _assert_same(want, got)
    finally:
        writer.join(10)
        reader.close()
        ring.close()
    assert not writer.is_alive()


def test_reader_of_a_gone_writer_stops() -> None:
    ring = ShmRing.create(num_readers=1, num_slots=2, slot_bytes=64)
    reader = ShmRing.attach(ring.handle, 0)
    t0 = time.monotonic()
    try:
        with pytest.raises(PeerGone):
            reader.read(command_codec.decode, lambda: time.monotonic() - t0 < 0.2, spin_s=0.0)
    finally:
        reader.close()
        ring.close()
    assert time.monotonic() - t0 < 2.0


def _broadcast_rank(rank: int, store_path: str) -> None:
    import torch
    from pagedkv.distributed import (
        destroy_model_parallel,
        get_world_group,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from pagedkv.engine.command_channel import BroadcastChannel

    store = torch.distributed.FileStore(store_path, 2)
    init_distributed_environment(2, rank, "gloo", None, 30.0, store)
    initialize_model_parallel(2, 1, torch.device("cpu"))
    chan = BroadcastChannel(get_world_group())
    # A small command, one past the first buffer (a second broadcast), then small again.
    commands = [("execute", (_plan(3, 2, 1),)), ("execute", (_plan(300, 80, 2),)), ("stop", ())]
    assert command_codec.encode(*commands[1])[0] > BroadcastChannel.CAPACITY
    try:
        for name, args in commands:
            if rank == 0:
                chan.send(name, args)
            else:
                got = chan.recv()
                assert got[0] == name
                _assert_same(args, got[1])
    finally:
        destroy_model_parallel()


def test_flat_broadcast_carries_small_and_oversized_commands(tmp_path) -> None:
    """torchrun's carrier, on gloo between two processes (forked: seconds, not a re-import)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_broadcast_rank, args=(r, str(tmp_path / "store"))) for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0, 0], codes


def _toggle_sleeping(handle: tuple, seconds: float) -> None:
    """A reader process that raises and lowers its "sleeping" flag as fast as it can."""
    ring = ShmRing.attach(handle, 0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(1000):
            ring.sleeping[0] = 1
            ring.sleeping[0] = 0


def test_publish_reads_the_flags_while_readers_flip_them() -> None:
    """The readers raise and lower their flags while the writer publishes: the writer must
    read a snapshot (numpy's nonzero counts, then fills, and raises when the count moved in
    between: a CI run lost its parallel engine to that)."""
    ring = ShmRing.create(num_readers=1, num_slots=2, slot_bytes=64)
    error = None
    try:
        proc = multiprocessing.get_context("spawn").Process(
            target=_toggle_sleeping, args=(ring.handle, 4.0)
        )
        proc.start()
        while int(ring.sleeping[0]) == 0 and proc.is_alive():
            pass  # the reader is flipping now
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for _ in range(2000):
                ring.publish(0)  # (no reader reads: publish alone, no slot reuse waits)
        proc.join(10)
        while ring.wakeups[0].acquire(block=False):
            pass
    except RuntimeError as exc:  # (kept as text: a traceback's arrays outlive the segment)
        error = repr(exc)
    finally:
        ring.close()
    assert error is None, error


_TOUCH_AFTER_CLOSE = """
import gc, os, sys
from pagedkv.distributed.shm_ring import ShmRing


def mapped(name):
    with open("/proc/self/maps") as f:
        return name in f.read()


ring = ShmRing.create(num_readers=1, num_slots=2, slot_bytes=4096)
name = ring.shm.name
reader = ShmRing.attach(ring.handle, 0)
dropped = ShmRing.attach(ring.handle, 0)
del dropped  # (never closed: its mapping goes with it, quietly)
gc.collect()
slot, hdr, flags = ring.slots[1], ring.hdr, reader.sleeping  # (as a traceback's frame keeps them)
reader.close()
ring.close()
assert not os.path.exists("/dev/shm/" + name), "close() left the segment's name"
slot[:] = 7  # the mapping must still be there
hdr[0, 0] = 1
assert int(slot.sum()) == 7 * 4096 and int(hdr[0, 0]) == 1 and int(flags.sum()) == 0
assert mapped(name)
del slot, hdr, flags
gc.collect()
assert not mapped(name), "the segment stayed mapped after its last view went"
bare = ShmRing.create(num_readers=1, num_slots=2, slot_bytes=64)
bare.close()
assert not mapped(bare.shm.name), "close() without views must unmap at once"
print("OK", flush=True)
"""


def test_views_of_a_closed_ring_stay_valid_until_they_go(tmp_path) -> None:
    """close() while views of the segment are still referenced (a failed test's traceback,
    another thread): touching them must not crash (pytest once segfaulted printing such
    locals); the mapping goes with the last view, and at once when none is left; a ring
    dropped unclosed goes quietly. In a subprocess: a crash then fails this test instead of
    ending pytest."""
    import os
    import subprocess
    import sys

    script = tmp_path / "touch.py"
    script.write_text(_TOUCH_AFTER_CLOSE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0 and "OK" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert "Exception ignored" not in done.stderr, done.stderr[-2000:]
