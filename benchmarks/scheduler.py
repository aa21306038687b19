"""Scheduler step cost: pagedkv's C++ scheduler vs a plain-Python scheduler (nano-vllm style).

Both do the same work per step: pick the batch under the token budget (running decodes, then
chunked prefills of waiting requests), grow block tables, build the flat metadata (input_ids,
positions, slot_mapping, seq_lens, context_lens, query_start_loc, padded block_tables) as numpy
arrays, then apply the sampled tokens (append, stop check, free finished, cache full blocks).

    python benchmarks/scheduler.py [--seqs 1024] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections import deque

# OpenBLAS worker threads spin after each numpy call and steal a core from the timed loop on a
# 2-core machine; neither side uses BLAS.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from pagedkv import Scheduler, SchedulerConfig  # noqa: E402

BLOCK = 16


# ---- the plain-Python peer -----------------------------------------------------------------
class PySeq:
    __slots__ = ("id", "tokens", "num_prompt", "max_tokens", "num_computed", "blocks", "hashes")

    def __init__(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        self.id, self.tokens, self.num_prompt = rid, list(prompt), len(prompt)
        self.max_tokens, self.num_computed = max_tokens, 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []


class PyBlockManager:
    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.caching = caching
        self.free: deque[int] = deque(range(num_blocks))
        self.ref = [0] * num_blocks
        self.cached: dict[int, int] = {}  # hash -> block

    def can_allocate(self, n: int) -> bool:
        return len(self.free) >= n

    def allocate(self, seq: PySeq, total_tokens: int) -> None:
        while len(seq.blocks) * BLOCK < total_tokens:
            b = self.free.popleft()
            self.ref[b] = 1
            seq.blocks.append(b)

    def cache_full(self, seq: PySeq) -> None:
        while self.caching and (len(seq.hashes) + 1) * BLOCK <= seq.num_computed:
            j = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else 0
            h = hash((parent, tuple(seq.tokens[j * BLOCK : (j + 1) * BLOCK])))
            self.cached.setdefault(h, seq.blocks[j])
            seq.hashes.append(h)

    def release(self, seq: PySeq) -> None:
        for b in reversed(seq.blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        seq.blocks.clear()


class PyScheduler:
    def __init__(
        self, num_blocks: int, max_seqs: int, budget: int, max_blocks: int, caching: bool
    ) -> None:
        self.bm = PyBlockManager(num_blocks, caching)
        self.max_seqs, self.budget, self.max_blocks = max_seqs, budget, max_blocks
        self.waiting: deque[PySeq] = deque()
        self.running: list[PySeq] = []

    def add_request(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        self.waiting.append(PySeq(rid, prompt, max_tokens))

    def schedule(self) -> tuple[list[tuple[PySeq, int]], dict[str, np.ndarray]]:
        budget, batch = self.budget, []
        for seq in self.running:
            n = min(len(seq.tokens) - seq.num_computed, budget)
            if n <= 0:
                break
            need = -(-(seq.num_computed + n) // BLOCK) - len(seq.blocks)
            if not self.bm.can_allocate(need):
                break  # (the benchmark never runs out of blocks)
            self.bm.allocate(seq, seq.num_computed + n)
            batch.append((seq, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            n = min(len(seq.tokens), budget)
            if not self.bm.can_allocate(-(-n // BLOCK)):
                break
            self.waiting.popleft()
            self.bm.allocate(seq, n)
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        prefills = [b for b in batch if b[0].num_computed < b[0].num_prompt]
        batch = prefills + [b for b in batch if b[0].num_computed >= b[0].num_prompt]
        ids, pos, slots, seq_lens, ctx, qsl = [], [], [], [], [], [0]
        tables = []
        for seq, n in batch:
            c = seq.num_computed
            for p in range(c, c + n):
                ids.append(seq.tokens[p])
                pos.append(p)
                slots.append(seq.blocks[p // BLOCK] * BLOCK + p % BLOCK)
            seq_lens.append(c + n)
            ctx.append(c)
            qsl.append(qsl[-1] + n)
            tables.append(seq.blocks + [0] * (self.max_blocks - len(seq.blocks)))
        meta = {
            "input_ids": np.array(ids, dtype=np.int32),
            "positions": np.array(pos, dtype=np.int64),
            "slot_mapping": np.array(slots, dtype=np.int64),
            "seq_lens": np.array(seq_lens, dtype=np.int32),
            "context_lens": np.array(ctx, dtype=np.int32),
            "query_start_loc": np.array(qsl, dtype=np.int32),
            "block_tables": np.array(tables, dtype=np.int32),
        }
        return batch, meta

    def update(self, batch: list[tuple[PySeq, int]], sampled: np.ndarray) -> list[str]:
        finished = []
        for (seq, n), tok in zip(batch, sampled.tolist()):
            seq.num_computed += n
            self.bm.cache_full(seq)
            if seq.num_computed == len(seq.tokens):
                seq.tokens.append(tok)
                if len(seq.tokens) - seq.num_prompt >= seq.max_tokens:
                    finished.append(seq.id)
                    self.bm.release(seq)
        if finished:
            done = set(finished)
            self.running = [s for s in self.running if s.id not in done]
        return finished


# ---- the workloads -------------------------------------------------------------------------
def run_cpp(
    cfg: SchedulerConfig, prompts, max_tokens, steps, warmup, arrivals, shape: list | None = None
) -> float:
    s = Scheduler(cfg)
    for i, p in enumerate(prompts):
        s.add_request(f"r{i}", p, max_tokens, ignore_eos=True)
    sampled = np.full(cfg.max_num_seqs, 7, dtype=np.int64)
    nxt, t = len(prompts), 0.0
    for step in range(warmup + steps):
        for p in arrivals(step):
            s.add_request(f"r{nxt}", p, max_tokens, ignore_eos=True)
            nxt += 1
        t0 = time.perf_counter()
        plan = s.schedule()
        s.update(plan, sampled[: plan.num_seqs])
        if step >= warmup:
            t += time.perf_counter() - t0
            if shape is not None:
                shape.append((plan.num_seqs, plan.num_prefills, plan.num_tokens))
    return t / steps


def run_py(cfg: SchedulerConfig, prompts, max_tokens, steps, warmup, arrivals) -> float:
    s = PyScheduler(
        cfg.num_blocks,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.max_blocks_per_seq,
        cfg.enable_prefix_caching,
    )
    for i, p in enumerate(prompts):
        s.add_request(f"r{i}", p, max_tokens)
    sampled = np.full(cfg.max_num_seqs, 7, dtype=np.int64)
    nxt, t = len(prompts), 0.0
    for step in range(warmup + steps):
        for p in arrivals(step):
            s.add_request(f"r{nxt}", p, max_tokens)
            nxt += 1
        t0 = time.perf_counter()
        batch, _meta = s.schedule()
        s.update(batch, sampled[: len(batch)])
        if step >= warmup:
            t += time.perf_counter() - t0
    return t / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, default=1024, help="running decodes")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per workload")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.seqs

    # 1) decode: n running sequences (prompt 128), one token each per step; with and without
    # prefix caching (registering each block that fills up costs a hash-table insert).
    rows = []
    prompts = [rng.integers(0, 32000, 128).tolist() for _ in range(n)]
    for caching in (True, False):
        cfg = SchedulerConfig(
            num_blocks=n * 48,
            block_size=BLOCK,
            max_num_seqs=n,
            max_num_batched_tokens=2 * n + 1024,
            max_model_len=768,
            enable_prefix_caching=caching,
        )
        warm = -(-128 * n // (cfg.max_num_batched_tokens - n)) + 4  # all prefills done
        args_dec = (cfg, prompts, 600, args.steps, warm, lambda step: ())
        shape: list = []
        c = run_cpp(*args_dec, shape=shape)
        name = f"decode {n} seqs, prefix cache {'on' if caching else 'off'}"
        rows.append((name, c, run_py(*args_dec), shape))

    # 2) mixed: 256 decodes finishing after 64 tokens, new 512-token prompts arriving each
    # step and prefilled in chunks under the 2048-token budget.
    cfg2 = SchedulerConfig(
        num_blocks=16384,
        block_size=BLOCK,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=1024,
    )
    prompts2 = [rng.integers(0, 32000, 512).tolist() for _ in range(256)]
    stream = [rng.integers(0, 32000, 512).tolist() for _ in range(8)]
    args_mix = (cfg2, prompts2, 64, args.steps, 40, lambda step: stream[:4])
    shape = []
    c = run_cpp(*args_mix, shape=shape)
    rows.append(("mixed prefill+decode", c, run_py(*args_mix), shape))

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
        f"{platform.python_version()}; schedule()+update() per step, mean of {args.steps}"
    )
    print(
        f"{'workload':<34} {'seqs':>5} {'prefills':>8} {'tokens':>6} {'pagedkv us':>10} "
        f"{'python us':>10} {'speedup':>8}"
    )
    for name, c, p, sh in rows:
        seqs, pre, tok = (float(np.mean([x[k] for x in sh])) for k in range(3))
        print(
            f"{name:<34} {seqs:>5.0f} {pre:>8.1f} {tok:>6.0f} {c * 1e6:>10.1f} "
            f"{p * 1e6:>10.1f} {p / c:>7.1f}x"
        )


if __name__ == "__main__":
    main()
