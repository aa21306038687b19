"""What one step costs the driver and a worker of a parallel engine, beyond the model's work.

On the CPU (gloo), on a tiny model where the forward is cheap, so the per-step plumbing shows:

  engine     decode step time of LLM(tensor_parallel_size=1 / 2) at batch 1 and 32 (the TP=2
             excess over TP=1 is the per-step overhead: command transport, the workers' step,
             the tiny model's all-reduces)
  transport  one step's command (a decode PlanArrays of batch B, 2 k-token block tables) from
             the driver to W workers by each carrier: the driver's send time and the latency
             until a worker holds the decoded plan (medians; system-wide monotonic clock),
             messages 2 ms apart so none queues behind another:
               pickle   GroupCoordinator.broadcast_object over gloo (the carrier before #29)
               flat     one flat uint8 tensor broadcast over gloo (the torchrun path)
               shm      the shared-memory ring (single node), workers not spinning (the
                        CPU engine's setting: they yield, then sleep on a semaphore)
               shm-spin the same, workers busy-spinning first (the CUDA engine's setting)

  pipeline   prefill time of PP=2 with micro-batches off and on (8 layers, hidden 256, 8 x 96
             prompt tokens): the stages overlap when micro-batched

  PYTHONPATH=python python3 benchmarks/parallel_step_overhead.py [engine|transport|pipeline|all]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import socket
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
import torch

BATCHES = (1, 32, 256)
MESSAGES = 200
GAP_S = 0.002


# ---------------------------------------------------------------------------------- engine
def save_step_model(out_dir: str) -> str:
    """The decode-step benchmarks' model: a 2-layer random Llama (hidden 64) whose forward is
    cheap next to the per-step plumbing."""
    from pagedkv.testing import save_random_model

    return save_random_model(
        out_dir,
        "tiny-llama",
        seed=0,
        tokenizer=False,
        vocab_size=300,
        hidden_size=64,
        head_dim=32,
        num_hidden_layers=2,
    )


def step_llm(path: str, max_num_seqs: int, **kw: Any) -> Any:
    """A CPU engine on ``path`` for batches of up to ``max_num_seqs`` (``kw``: parallelism)."""
    from pagedkv import LLM

    return LLM(
        path,
        device="cpu",
        skip_tokenizer_init=True,
        max_model_len=256,
        max_num_seqs=max_num_seqs,
        kv_cache_space=0.05,
        **kw,
    )


def step_prompts(batch: int) -> List[Dict[str, Any]]:
    """``batch`` 8-token prompts of one repeated token id each."""
    return [{"prompt_token_ids": [3 + i % 200] * 8} for i in range(batch)]


def _run(llm: Any, prompts: List[Dict[str, Any]], max_tokens: int) -> float:
    from pagedkv import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0


def engine_steps(tp_sizes: List[int], batches: List[int], steps: int) -> Dict[str, float]:
    torch.set_num_threads(1)
    res: Dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = save_step_model(os.path.join(tmp, "m"))
        for tp in tp_sizes:
            llm = step_llm(path, max(batches), tensor_parallel_size=tp)
            for bs in batches:
                prompts = step_prompts(bs)
                _run(llm, prompts, 4)  # warm-up
                best = min(
                    (_run(llm, prompts, steps + 1) - _run(llm, prompts, 1)) / steps
                    for _ in range(3)
                )
                res[f"tp{tp}_b{bs}"] = best * 1e3
                print(f"engine tp={tp} batch {bs}: decode step {best * 1e3:.2f} ms", flush=True)
            del llm
    return res


# ---------------------------------------------------------------------------------- pipeline
def pipeline_prefill(micro_tokens: List[int], repeats: int) -> Dict[str, float]:
    """Prefill time of PP=2 (one process per stage) with micro-batches off (0) or of the given
    sizes: with them, stage 1 runs micro-batch j while stage 2 runs j-1."""
    from pagedkv import LLM
    from pagedkv.testing import save_random_model

    torch.set_num_threads(1)
    res: Dict[str, float] = {}
    prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 250 for j in range(96)]} for i in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        path = save_random_model(
            os.path.join(tmp, "m"),
            "tiny-llama",
            seed=0,
            tokenizer=False,
            vocab_size=300,
            hidden_size=256,
            head_dim=32,
            intermediate_size=1024,
            num_hidden_layers=8,
        )
        for micro in micro_tokens:
            llm = LLM(
                path,
                device="cpu",
                skip_tokenizer_init=True,
                max_model_len=256,
                kv_cache_space=0.05,
                enable_prefix_caching=False,
                pipeline_parallel_size=2,
                pipeline_micro_batch_tokens=micro,
            )
            _run(llm, prompts[:2], 1)  # warm-up
            best = min(_run(llm, prompts, 1) for _ in range(repeats))
            res[f"micro{micro}"] = best * 1e3
            print(
                f"pipeline PP=2 micro-batch tokens {micro}: 8 x 96-token prefill "
                f"{best * 1e3:.1f} ms",
                flush=True,
            )
            del llm
    return res


# ---------------------------------------------------------------------------------- transport
def _plan(batch: int) -> Any:
    from pagedkv.engine.plan_arrays import PlanArrays

    g = np.random.default_rng(batch)
    return PlanArrays(
        step=7,
        num_seqs=batch,
        num_prefills=0,
        num_prefill_tokens=0,
        num_decode_tokens=batch,
        num_tokens=batch,
        max_query_len=1,
        max_decode_seq_len=2048,
        input_ids=g.integers(0, 1000, batch).astype(np.int32),
        positions=np.full(batch, 2047, np.int64),
        slot_mapping=g.integers(0, 1 << 20, batch).astype(np.int64),
        seq_lens=np.full(batch, 2048, np.int32),
        query_start_loc=np.arange(batch + 1, dtype=np.int32),
        block_tables=g.integers(0, 1 << 16, (batch, 128)).astype(np.int32),
        blocks_to_swap_out=np.zeros((0, 2), np.int64),
        blocks_to_swap_in=np.zeros((0, 2), np.int64),
        blocks_to_copy=np.zeros((0, 2), np.int64),
    )


def _carrier(kind: str, rank: int, world: int, shm: Any) -> Any:
    from pagedkv.distributed import get_world_group
    from pagedkv.engine.command_channel import BroadcastChannel, ShmChannel
    from pagedkv.engine.executor_mp import _CUDA_SPIN_S

    if kind == "pickle":
        return None
    if kind == "flat":
        return BroadcastChannel(get_world_group())
    if rank == 0:
        return shm
    if not isinstance(shm, ShmChannel):  # (one reader for both shm runs: it counts messages)
        shm = ShmChannel.attach(shm, rank - 1, lambda: True)
    shm.spin_s = _CUDA_SPIN_S if kind == "shm-spin" else 0.0
    return shm


def _send(kind: str, carrier: Any, msg: Any) -> None:
    from pagedkv.distributed import get_world_group

    if kind == "pickle":
        get_world_group().broadcast_object(msg, src=0)
    else:
        carrier.send(*msg)


def _recv(kind: str, carrier: Any) -> Any:
    from pagedkv.distributed import get_world_group

    if kind == "pickle":
        return get_world_group().broadcast_object(None, src=0)
    return carrier.recv()


def _transport_rank(rank: int, world: int, port: int, shm: Any, out: Any) -> None:
    import torch.distributed as dist
    from pagedkv.distributed import (
        get_world_group,
        init_distributed_environment,
        initialize_model_parallel,
    )

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, datetime.timedelta(seconds=60))
    init_distributed_environment(world, rank, "gloo", None, 60.0, store)
    initialize_model_parallel(world, 1, torch.device("cpu"))
    group = get_world_group()
    results: Dict[str, Any] = {}
    for kind in ("pickle", "flat", "shm", "shm-spin"):
        carrier = _carrier(kind, rank, world, shm)
        if kind.startswith("shm"):
            shm = carrier
        for bs in BATCHES:
            msg = ("execute", (_plan(bs),))
            sends, times = [], []
            for _ in range(MESSAGES + 10):
                if rank == 0:
                    time.sleep(GAP_S)
                    t0 = time.perf_counter()
                    _send(kind, carrier, msg)
                    t1 = time.perf_counter()
                    sends.append((t0, t1))
                else:
                    got = _recv(kind, carrier)
                    times.append(time.perf_counter())
                    assert got[1][0].num_seqs == bs
            gathered = [None] * world
            dist.all_gather_object(gathered, (sends, times), group=group.cpu_group)
            if rank == 0:
                t_send = [s for s, _ in gathered[0][0]][10:]
                # Medians: a shared machine's scheduling hiccups would dominate a mean.
                send_us = np.median([b - a for a, b in gathered[0][0][10:]]) * 1e6
                lat = [
                    np.median(np.array(w[1][10:]) - np.array(t_send)) * 1e6 for w in gathered[1:]
                ]
                results[f"{kind}_b{bs}"] = (send_us, max(lat))
                print(
                    f"transport {kind:6s} batch {bs:3d}: driver send {send_us:8.1f} us, "
                    f"worker has the plan after {max(lat):8.1f} us",
                    flush=True,
                )
    if rank == 0:
        out.put(results)
    dist.barrier(group=group.cpu_group)


def transport(world: int) -> Dict[str, Any]:
    from pagedkv.engine.command_channel import ShmChannel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    ring = ShmChannel.create(num_readers=world - 1)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_transport_rank, args=(r, world, port, ring.handle, out))
        for r in range(1, world)
    ]
    for p in procs:
        p.start()
    try:
        _transport_rank(0, world, port, ring, out)
        return out.get(timeout=10)
    finally:
        for p in procs:
            p.join(30)
        ring.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "what", nargs="?", default="all", choices=["engine", "transport", "pipeline", "all"]
    )
    ap.add_argument("--ranks", type=int, default=2, help="transport: driver + ranks-1 workers")
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    if args.what in ("engine", "all"):
        engine_steps([1, 2], [1, 32], args.steps)
    if args.what in ("transport", "all"):
        transport(args.ranks)
    if args.what in ("pipeline", "all"):
        pipeline_prefill([0, 96], 5)


if __name__ == "__main__":
    main()
