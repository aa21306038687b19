"""MultiprocExecutor: the driver's side of a tensor/pipeline-parallel engine (vLLM's ``mp``).

The engine process is global rank 0 (the driver): it runs the scheduler and sampler and its own
Worker. Single node, it spawns one process per other rank and sets up the process group itself
(gloo on the CPU, NCCL on CUDA; a TCP rendezvous on localhost). Under ``torchrun`` (RANK,
WORLD_SIZE, MASTER_ADDR in the environment: vLLM's ``external_launcher``) the launcher started
every rank: rank 0 becomes the driver and the other ranks serve its commands, then exit.

Each call of the runner interface (execute, compute_logits, apply_block_ops, set-up steps) is
sent to the workers as a command with the plan as flat arrays (PlanArrays), then run locally:
all ranks run the same Worker method together (see worker.py). The commands travel as flat
bytes (command_channel.py): through a shared-memory ring when the driver spawned the workers
(on x86: the ring relies on its store order), as one flat-buffer broadcast (gloo) under
torchrun and on other machines.

Failure: a monitor thread watches the worker processes; when one dies, the others are killed
(and NCCL's communicators aborted), so the driver's pending collective fails at once and the
engine raises naming the dead rank; the driver's own thread then tears the groups down. Every
collective has a timeout. Ctrl-C or any error in the middle of a command leaves the ranks out
of step: the executor then shuts the workers down and refuses further calls. Workers end with
the driver (shutdown command, or they notice their parent is gone); finalisers and atexit make
sure none is left behind.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
import time
import weakref
from typing import Any, List, NamedTuple, Optional, Tuple

import numpy as np
import torch

from pagedkv.distributed import (
    abort_communicators,
    abort_model_parallel,
    destroy_model_parallel,
    get_world_group,
    init_distributed_environment,
    initialize_model_parallel,
    model_parallel_is_initialized,
)
from pagedkv.distributed.shm_ring import ShmRing
from pagedkv.engine.command_channel import BroadcastChannel, ShmChannel
from pagedkv.engine.config import EngineConfig
from pagedkv.engine.plan_arrays import PlanArrays
from pagedkv.engine.request_failures import EngineDownError
from pagedkv.engine.worker import SHUTDOWN, Worker, worker_loop

logger = logging.getLogger("pagedkv")

# Bounds each collective on the device groups (a stage waits for the previous one's forward,
# so this is far above a step): a peer that hangs ends the engine with an error, not a hang.
COLLECTIVE_TIMEOUT_S = 600.0
_JOIN_TIMEOUT_S = 10.0
# How long the driver's share of the collective group teardown may take (every rank destroys
# its groups together; a few seconds for NCCL's finalize): past it, a worker is stuck.
_DESTROY_TIMEOUT_S = 60.0
# How long a driver whose command raised waits for a worker's exit to show (the cause to name).
_NAME_DEAD_WORKER_S = 1.0
# Start-up: how long spawned ranks may take to import and reach the rendezvous.
_STORE_TIMEOUT = datetime.timedelta(seconds=300)
# How long a worker waiting for the next command busy-spins before yielding its core: a
# decode step's host gap on a GPU; on the CPU the ranks share the cores, so no spin.
_CUDA_SPIN_S = 0.02


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


class PerRank(NamedTuple):
    """A command argument that differs between the ranks: e.g. the driver's device tensor of
    tokens, whose count alone goes to the workers (they receive the values in a collective)."""

    workers: Any
    driver: Any


class _Procs:
    """The spawned worker processes and the executor's health (shared with the finaliser and
    the monitor thread, which must not hold the executor itself)."""

    def __init__(self) -> None:
        self.procs: List[Any] = []
        self.channel: Any = None  # the driver's end of the command channel
        self.dead: Optional[str] = None  # why the executor can no longer run steps
        self.closing = False
        self.lock = threading.Lock()
        self.monitor: Optional[threading.Thread] = None  # (_monitor)
        # Held by the thread running a command (the channel and the groups in use): teardown
        # from another thread waits for it (_hold_commands).
        self.command = threading.RLock()
        # The driver's own rank (its Worker): its CUDA graphs go before its process groups.
        self.worker: Any = None

    def kill_all(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(_JOIN_TIMEOUT_S)

    def exited(self, timeout: Optional[float]) -> Optional[str]:
        """Which worker exited and how, waiting up to ``timeout`` s (None: for ever) for one
        to; None if none did."""
        if not self.procs:
            return None
        ready = multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout)
        dead = next((p for p in self.procs if p.sentinel in ready), None)
        if dead is None:
            return None
        dead.join(1.0)
        code, until = dead.exitcode, time.monotonic() + 1.0
        while code is None and time.monotonic() < until:  # (another thread is reaping it)
            time.sleep(0.01)
            code = dead.exitcode
        rank = self.procs.index(dead) + 1
        return f"worker rank {rank} (pid {dead.pid}) exited unexpectedly with exit code {code}"


class MultiprocExecutor:
    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        if model_parallel_is_initialized():
            raise RuntimeError(
                "a tensor/pipeline-parallel engine is already running in this "
                "process; shut it down (del the LLM) before starting another"
            )
        tp, pp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size
        if cfg.tp_all_reduce == "one_shot" and device.type != "cuda":
            raise ValueError(
                "tp_all_reduce='one_shot' (a symmetric-memory all-reduce over NVLink) needs "
                f"CUDA devices, not {device.type}; use tp_all_reduce='nccl'"
            )
        self.world_size, self.pp_size = tp * pp, pp
        # Rows of the last decode step whose logits the workers computed unasked (execute).
        self._pending_logits: Optional[int] = None
        self.block_size = cfg.block_size
        self._state = _Procs()
        backend = "nccl" if device.type == "cuda" else "gloo"
        if launched_by_torchrun():
            rank, world, local_rank = _torchrun_ranks(self.world_size)
            device = _rank_device(device, local_rank)
            init_distributed_environment(world, rank, backend, "env://", COLLECTIVE_TIMEOUT_S)
            initialize_model_parallel(tp, pp, device)
            self._state.channel = BroadcastChannel(get_world_group())
            if rank != 0:
                # torchrun forwards SIGTERM to every rank; only the driver decides what it means
                # (the server drains, then shuts the workers down), as with Ctrl-C below.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                # Until the driver shuts down; never returns.
                _serve_as_worker(cfg, device, self._state.channel)
            self._finalizer = weakref.finalize(self, _shutdown, self._state)
        else:
            port = _free_port()
            store = torch.distributed.TCPStore(
                "127.0.0.1", port, self.world_size, True, _STORE_TIMEOUT, wait_for_workers=False
            )
            state = self._state
            if ShmRing.ordered():
                state.channel = ShmChannel.create(self.world_size - 1, COLLECTIVE_TIMEOUT_S)
                state.channel.alive = lambda: state.dead is None
            self._spawn(cfg, device, port)
            self._finalizer = weakref.finalize(self, _shutdown, self._state)
            _wait_until_ready(store, self._state)
            device = _rank_device(device, 0)
            init_distributed_environment(
                self.world_size, 0, backend, None, COLLECTIVE_TIMEOUT_S, store
            )
            initialize_model_parallel(tp, pp, device)
            if state.channel is None:  # (no ordered ring on this machine)
                state.channel = BroadcastChannel(get_world_group())
        self.device = device
        try:
            self.worker = Worker(cfg, device)
        except BaseException:
            self.shutdown()
            raise
        self._state.worker = self.worker
        self.model, self.model_config = self.worker.model, self.worker.model_config
        self.max_model_len = 0
        self.max_num_batched_tokens = 0
        logger.info(
            "tensor parallel %d x pipeline parallel %d: %d ranks (%s)",
            tp,
            pp,
            self.world_size,
            backend,
        )

    def _spawn(self, cfg: EngineConfig, device: torch.device, port: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        channel = self._state.channel.handle if self._state.channel is not None else None
        for rank in range(1, self.world_size):
            p = ctx.Process(
                target=_worker_process,
                name=f"pagedkv-worker-{rank}",
                args=(cfg, rank, self.world_size, device, port, os.getpid(), channel),
                daemon=True,
            )
            p.start()
            self._state.procs.append(p)
        monitor = threading.Thread(
            target=_monitor, args=(self._state,), name="pagedkv-worker-monitor", daemon=True
        )
        self._state.monitor = monitor
        monitor.start()

    # ------------------------------------------------------------------ the runner interface
    def _run_all(self, name: str, *args: Any, send: bool = True) -> Any:
        """Runs Worker.<name>(*args) on every rank: the command to the others, then here (a
        PerRank argument: its ``workers`` value there, its ``driver`` value here). With
        ``send`` False, here only: the workers run their side without a command."""
        state = self._state
        with state.command:  # (teardown from another thread waits for it)
            if state.dead is not None or state.closing:
                _shutdown(state)  # (the monitor found a dead worker between two calls)
                raise EngineDownError(f"the parallel engine is down: {state.dead or 'shut down'}")
            try:
                if send:
                    self._flush_logits()
                    state.channel.send(name, [a.workers if type(a) is PerRank else a for a in args])
                return getattr(self.worker, name)(
                    *[a.driver if type(a) is PerRank else a for a in args]
                )
            except BaseException as exc:
                # A dead worker fails the collective: name it (its exit shows within moments; not
                # left to the monitor thread, which a loaded machine may wake much later).
                wait_s = _NAME_DEAD_WORKER_S if isinstance(exc, Exception) else 0.0
                why = (
                    state.dead
                    or state.exited(wait_s)
                    or f"{type(exc).__name__} during {name}() left the ranks out of step"
                )
                state.dead = why
                _shutdown(state)
                if isinstance(exc, Exception):
                    raise EngineDownError(f"the parallel engine is down: {why}") from exc
                raise

    def determine_num_blocks(self) -> Tuple[int, int]:
        return self._run_all("determine_num_blocks")

    def make_runner(self, max_model_len: int, max_num_batched_tokens: int) -> None:
        self.max_model_len, self.max_num_batched_tokens = max_model_len, max_num_batched_tokens
        self._run_all("make_runner", max_model_len, max_num_batched_tokens)

    def allocate_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        # max_model_len / max_num_batched_tokens may have been lowered since make_runner.
        self._run_all(
            "allocate_kv_cache",
            num_blocks,
            num_cpu_blocks,
            self.max_model_len,
            self.max_num_batched_tokens,
        )

    def capture_cuda_graphs(self, max_num_seqs: int) -> None:
        self._run_all("capture_cuda_graphs", max_num_seqs)

    def min_graph_replays(self) -> int:
        """The fewest decode steps run as CUDA-graph replays on any rank (tests, benchmarks)."""
        return self._run_all("min_graph_replays")

    def execute(self, plan: Any, prev_tokens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] when the driver is on the last stage; otherwise
        a [num_tokens, 0] placeholder (the last stage keeps them for compute_logits).
        ``prev_tokens``: the previous step's tokens on the driver's device (overlapped
        scheduling): the workers get their count, then the tokens in a device broadcast."""
        arrays = self._arrays(plan)
        prev = None if prev_tokens is None else PerRank(len(prev_tokens), prev_tokens)
        n = int(plan.num_tokens)
        if self.pp_size == 1 and int(plan.num_prefills) == 0 and n == int(plan.num_seqs):
            # A plain decode step samples every row: the workers go on to their share of its
            # logits at once (the LM head's all-gather), and the driver's compute_logits of
            # all rows needs no second command (see compute_logits).
            out = self._run_all("execute", arrays, prev, PerRank(True, False))
            self._pending_logits = n
        else:
            out = self._run_all("execute", arrays, prev)
        if out is None:
            return torch.empty(int(plan.num_tokens), 0, device=self.device)
        return out

    def compute_logits(
        self, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None, upcast: bool = True
    ) -> torch.Tensor:
        n = self._pending_logits
        if n is not None and (rows is not None or hidden.shape[0] == n):
            # Were these the rows the workers computed theirs for (execute)? (A host copy of
            # the rows: sampling on the host, or rows dropped since the plan; both rare or
            # waiting for the device anyway.)
            idx = None if rows is None else rows.cpu().numpy().astype(np.int64)
            if idx is None or np.array_equal(idx, np.arange(n)):
                self._pending_logits = None  # the same collective: nothing to send
                return self._run_all("compute_logits", None, n, upcast, send=False)
            return self._run_all("compute_logits", idx, len(idx), upcast)
        if rows is None:
            return self._run_all("compute_logits", None, hidden.shape[0], upcast)
        # The rows' count goes in the command, the rows themselves by a device broadcast: no
        # host copy waiting for the device (an overlapped step's prefill rows).
        return self._run_all("compute_logits", PerRank(len(rows), rows), len(rows), upcast)

    def _flush_logits(self) -> None:
        """Before any other command: the driver's side of the logits collective the workers
        ran after the last decode step, when the engine asked for other rows or none (its
        result is dropped). The ranks' collectives then stay in the same order."""
        n, self._pending_logits = self._pending_logits, None
        if n is not None:
            self.worker.compute_logits(None, n, False)

    def apply_block_ops(self, plan: Any) -> None:
        self._run_all("apply_block_ops", self._arrays(plan))

    def finish_swap_out(self, plan: Any) -> None:
        if self.is_alive:  # a dead or shut-down engine has no cache left to save
            self._run_all("finish_swap_out", self._arrays(plan))

    def _arrays(self, plan: Any) -> PlanArrays:
        return plan if isinstance(plan, PlanArrays) else PlanArrays.from_plan(plan, self.block_size)

    def __getattr__(self, name: str) -> Any:
        # The rest of ModelRunner's surface (kv_caches, graphs, block_bytes, ...), as the
        # driver's own rank has it.
        worker = self.__dict__.get("worker")
        if worker is None or worker.runner is None:
            raise AttributeError(name)
        return getattr(worker.runner, name)

    def shutdown(self) -> None:
        # (Workers waiting in a logits collective would not hear the stop; a command still
        # running in another thread: _shutdown deals with it.)
        if self._state.command.acquire(timeout=_JOIN_TIMEOUT_S):
            try:
                if self.is_alive:
                    with contextlib.suppress(Exception):
                        self._flush_logits()
            finally:
                self._state.command.release()
        self._finalizer()

    @property
    def is_alive(self) -> bool:
        return self._state.dead is None and not self._state.closing


def _shutdown(state: _Procs) -> None:
    """Ends the workers, then the groups, once no command runs (any thread; the first call
    does it, later ones return at once)."""
    with state.lock:
        if state.closing:
            return
        state.closing = True
    if not _hold_commands(state):
        return
    try:
        _tear_down(state)
    finally:
        state.command.release()


def _hold_commands(state: _Procs) -> bool:
    """Waits for a command running in another thread (tearing the channel or the groups down
    under it is a use-after-free); one that does not end in time is ended by stopping the
    workers (its collective fails). False if it still runs: the groups are left to the
    process' exit."""
    if state.command.acquire(timeout=_JOIN_TIMEOUT_S):
        return True
    logger.warning("shutdown: a command still runs in another thread; stopping the workers")
    state.dead = state.dead or "shut down while a command ran"
    state.kill_all()
    abort_communicators()
    if state.command.acquire(timeout=_JOIN_TIMEOUT_S):
        return True
    logger.error("shutdown: a command still runs in another thread; the groups are left as is")
    return False


def _tear_down(state: _Procs) -> None:
    """Ends the workers (a polite command first, while they are in step), then the groups."""
    _release_graphs(state.worker)
    state.worker = None
    if state.dead is None and state.exited(0) is None:
        try:
            state.channel.send(SHUTDOWN, ())
        except Exception as exc:  # noqa: BLE001 (a broken group: killing them follows)
            logger.warning("could not tell the workers to stop (%r); killing them", exc)
            state.dead = "shut down"
        else:
            _destroy_with_the_workers(state)
    else:
        state.dead = state.dead or "shut down"
    state.kill_all()  # (out of step, the workers wait for collectives that will not come)
    if state.dead is not None:
        monitor = state.monitor
        if monitor is not None and monitor is not threading.current_thread():
            # Every worker has exited: the monitor wakes, and may be aborting the
            # communicators (a worker died); destroying the groups under its abort is a
            # use-after-free.
            monitor.join(_JOIN_TIMEOUT_S)
        abort_model_parallel()
    if state.channel is not None:
        state.channel.close()


def _release_graphs(worker: Optional[Worker]) -> None:
    """A rank's CUDA graphs go before its groups: NCCL's destroy and abort both wait until the
    graphs that captured its collectives are gone (ModelRunner.release_cuda_graphs)."""
    if worker is None:
        return
    try:
        worker.release_cuda_graphs()
    except Exception as exc:  # noqa: BLE001 (shutting down: a failure is only reported)
        logger.warning("shutdown: releasing the CUDA graphs failed: %r", exc)


def _destroy_with_the_workers(state: _Procs) -> None:
    """Destroys the groups together with the workers, which do on SHUTDOWN. NCCL's
    communicator finalize and destroy are intra-node collectives: a driver that waited for the
    workers to exit first would find them waiting for it, kill them after the join timeout,
    then wait for ever in its own destroy. Bounded: a worker that never gets there (alive but
    stuck) is killed and the groups left to the process' exit, not waited for."""
    destroy = threading.Thread(target=_destroy_logged, name="pagedkv-destroy-groups", daemon=True)
    destroy.start()
    destroy.join(_DESTROY_TIMEOUT_S)
    if destroy.is_alive():
        logger.error(
            "shutdown: the ranks did not tear the process groups down together within %.0f s; "
            "killing the workers and leaving the groups to the process' exit",
            _DESTROY_TIMEOUT_S,
        )
        return
    for p in state.procs:
        p.join(_JOIN_TIMEOUT_S)


def _destroy_logged() -> None:
    try:
        destroy_model_parallel()
    except Exception as exc:  # noqa: BLE001 (shutting down: a failure is only reported)
        logger.warning("shutdown: destroying the process groups failed: %r", exc)


def _monitor(state: _Procs) -> None:
    """Waits for any worker to exit; one that exits while the engine runs takes it down."""
    why = state.exited(None)
    if state.closing:
        return
    state.dead = why
    logger.error("%s; stopping the other workers", state.dead)
    state.kill_all()
    # The driver's pending collective fails now, not at its timeout; the driver's own thread
    # then tears the groups down (_run_all -> _shutdown).
    abort_communicators()


def _wait_until_ready(store: Any, state: _Procs) -> None:
    """Waits for every spawned rank to reach the rendezvous; one that dies on the way (an
    import error, a bad device) ends the wait at once instead of the rendezvous' timeout."""
    keys = [f"ready/{p.name}" for p in state.procs]
    deadline = time.monotonic() + _STORE_TIMEOUT.total_seconds()
    while not store.check(keys):
        dead = [p for p in state.procs if not p.is_alive()]
        if dead or time.monotonic() > deadline:
            state.dead = (
                f"{dead[0].name} (pid {dead[0].pid}) exited with code "
                f"{dead[0].exitcode} while starting (its error is above)"
                if dead
                else "the workers did not start in time"
            )
            _shutdown(state)
            raise RuntimeError(f"the parallel engine could not start: {state.dead}")
        time.sleep(0.05)


def _worker_process(
    cfg: EngineConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    port: int,
    parent_pid: int,
    channel: Optional[Tuple[Any, ...]],
) -> None:
    """Entry point of a spawned rank."""
    # Ctrl-C reaches the whole process group: the driver alone decides what it means.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    device = _rank_device(device, rank)
    store = torch.distributed.TCPStore("127.0.0.1", port, world_size, False, _STORE_TIMEOUT)
    store.set(f"ready/{multiprocessing.current_process().name}", "1")
    init_distributed_environment(
        world_size,
        rank,
        "nccl" if device.type == "cuda" else "gloo",
        None,
        COLLECTIVE_TIMEOUT_S,
        store,
    )
    initialize_model_parallel(cfg.tensor_parallel_size, cfg.pipeline_parallel_size, device)
    spin_s = _CUDA_SPIN_S if device.type == "cuda" else 0.0
    alive = lambda: os.getppid() == parent_pid  # noqa: E731
    if channel is None:  # (the driver found no ordered ring on this machine)
        _serve_as_worker(cfg, device, BroadcastChannel(get_world_group()))
    else:
        _serve_as_worker(cfg, device, ShmChannel.attach(channel, rank - 1, alive, spin_s))


def _serve_as_worker(cfg: EngineConfig, device: torch.device, channel: Any) -> None:
    in_step, worker = False, None
    try:
        worker = Worker(cfg, device)
        in_step = worker_loop(worker, channel)
    finally:
        _release_graphs(worker)
        # Asked to stop, every rank destroys its groups together (NCCL's destroy is an
        # intra-node collective: _destroy_with_the_workers); with the driver gone or a command
        # failed, nobody would join it: abort, which waits for no one.
        if in_step:
            destroy_model_parallel()
        else:
            abort_model_parallel()
        channel.close()
    raise SystemExit(0)


def _exit_with_parent(parent_pid: int) -> None:
    """A worker whose driver is gone (killed, say) exits rather than linger as an orphan."""
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _rank_device(device: torch.device, local_rank: int) -> torch.device:
    if device.type != "cuda":
        return device
    dev = torch.device("cuda", (device.index or 0) + local_rank)
    torch.cuda.set_device(dev)
    return dev


def _torchrun_ranks(world_size: int) -> Tuple[int, int, int]:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != world_size:
        raise ValueError(
            f"torchrun started {world} processes, but tensor_parallel_size x "
            f"pipeline_parallel_size = {world_size}"
        )
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
