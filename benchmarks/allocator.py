"""Block allocator benchmark: pagedkv.BlockAllocator (C++ through nanobind, and the C++ core
alone) vs. a plain-Python allocator with the same semantics, side by side in one run.

Measures allocate/free, fork/free and prefix matching of 1k-token prompts (block size 16) on a
pool with a warm prefix cache, and prints a table with the ratios.

    python benchmarks/allocator.py [--no-cpp]

The C++ column compiles benchmarks/allocator_bench.cpp against the installed package
(pagedkv.cmake_dir()'s include/ and libpagedkv.a) with the system C++ compiler.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import pagedkv
from pagedkv import BlockAllocator

NUM_BLOCKS, BLOCK_SIZE, PROMPT_LEN = 8192, 16, 1024


class PyBlockAllocator:
    """The same semantics in plain Python: ref counts, one free queue (uncached blocks first,
    cached ones least recently freed first, hash dropped on reuse), blocks freed tail first,
    128-bit chained hash (blake2b) with the tokens compared on a hit."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.table: dict[bytes, int] = {}
        self.meta: dict[int, tuple[bytes, bytes, tuple[int, ...]]] = {}  # hash, parent, tokens

    def _pop(self) -> int:
        b, _ = self.queue.popitem(last=False)
        m = self.meta.pop(b, None)
        if m is not None and self.table.get(m[0]) == b:
            del self.table[m[0]]
        self.ref[b] = 1
        return b

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > len(self.queue):
            raise MemoryError(f"allocate: {n} blocks requested, only {len(self.queue)} free")
        return [self._pop() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        ref = self.ref
        for i, b in enumerate(ids):
            if not 0 <= b < len(ref) or ref[b] <= 0:
                for c in ids[:i]:
                    ref[c] += 1
                raise ValueError(f"ids: block {b} is not allocated")
            ref[b] -= 1
        for b in reversed(ids):
            if ref[b] == 0 and b not in self.queue:
                self.queue[b] = None
                if b not in self.meta:
                    self.queue.move_to_end(b, last=False)

    def fork(self, ids: list[int]) -> None:
        if any(not 0 <= b < len(self.ref) or self.ref[b] <= 0 for b in ids):
            raise ValueError("ids: block is not allocated")
        for b in ids:
            self.ref[b] += 1

    @staticmethod
    def hash_block(parent: bytes, tokens: tuple[int, ...]) -> bytes:
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(repr(tokens).encode())
        return h.digest()

    def cache_full_block(self, b: int, parent: bytes, tokens: list[int]) -> bytes:
        toks = tuple(tokens)
        h = self.hash_block(parent, toks)
        if b not in self.meta and h not in self.table:
            self.table[h] = b
            self.meta[b] = (h, parent, toks)
        return h

    def match_prefix(self, tokens: list[int]) -> list[int]:
        bs, ids, parent = self.block_size, [], b""
        for i in range(len(tokens) // bs):
            toks = tuple(tokens[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, toks)
            b = self.table.get(h)
            if b is None or self.meta[b][1:] != (parent, toks):
                break
            if self.ref[b] == 0:
                del self.queue[b]
            self.ref[b] += 1
            ids.append(b)
            parent = h
        return ids


def cache_prompt(a, prompt: list[int], root) -> None:
    ids = a.allocate(len(prompt) // BLOCK_SIZE)
    parent = root
    for i, b in enumerate(ids):
        parent = a.cache_full_block(b, parent, prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
    a.free(ids)


def time_per_call(body: Callable[[], object], min_time: float = 0.3) -> float:
    """Seconds per call: repeats `body` until `min_time` has passed, best of 3 rounds."""
    body()
    n, best = 1, float("inf")
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            body()
        dt = time.perf_counter() - t0
        if dt >= min_time / 3:
            break
        n *= 4
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            body()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def workload(a, root, rng: random.Random) -> dict[str, Callable[[], object]]:
    """Warms `a` with 64 cached 1k-token prompts (4096 blocks); returns the measured calls."""
    prompts = [[rng.randrange(50000) for _ in range(PROMPT_LEN)] for _ in range(64)]
    for p in prompts:
        cache_prompt(a, p, root)
    ids = a.allocate(16)
    hit = prompts[7] + [1]
    got = a.match_prefix(hit)  # the measured call really hits every block
    assert len(got) == PROMPT_LEN // BLOCK_SIZE
    a.free(got)
    half = prompts[9][: PROMPT_LEN // 2] + [7] * (PROMPT_LEN // 2)
    miss = [rng.randrange(50000) for _ in range(PROMPT_LEN)]
    counter = iter(range(10**9))

    def fresh() -> list[int]:  # new content each call (a unique first token changes every hash)
        p = list(miss)
        p[0] = 100000 + next(counter)
        return p

    # cache_prompt_1k evicts other prompts, so it runs last.
    return {
        "allocate1_free1": lambda: a.free(a.allocate(1)),
        "allocate16_free16": lambda: a.free(a.allocate(16)),
        "fork16_free16": lambda: (a.fork(ids), a.free(ids)),
        "match_prefix_1k_hit": lambda: a.free(a.match_prefix(hit)),
        "match_prefix_1k_half": lambda: a.free(a.match_prefix(half)),
        "match_prefix_1k_miss": lambda: a.match_prefix(miss),
        "cache_prompt_1k": lambda: cache_prompt(a, fresh(), root),
    }


def bench_side_by_side() -> tuple[dict[str, float], dict[str, float]]:
    """Python and pagedkv timed alternately per operation (best of 3 each), so that load on
    the shared machine hits both alike."""
    py_ops = workload(PyBlockAllocator(NUM_BLOCKS, BLOCK_SIZE), b"", random.Random(0))
    nb_ops = workload(BlockAllocator(NUM_BLOCKS, BLOCK_SIZE), None, random.Random(0))
    py: dict[str, float] = {}
    nb: dict[str, float] = {}
    for name in py_ops:
        for _ in range(3):
            py[name] = min(py.get(name, 1.0), time_per_call(py_ops[name], 0.1))
            nb[name] = min(nb.get(name, 1.0), time_per_call(nb_ops[name], 0.1))
    return py, nb


def run_cpp() -> dict[str, float]:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return {}
    cpp = Path(pagedkv.cmake_dir()).parents[2]  # .../pagedkv/cpp
    src = Path(__file__).with_name("allocator_bench.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "allocator_bench"
        subprocess.run(
            [
                cxx,
                "-O2",
                "-std=c++17",
                f"-I{cpp / 'include'}",
                str(src),
                str(cpp / "lib" / "libpagedkv.a"),
                "-o",
                str(exe),
                "-lpthread",
            ],
            check=True,
        )
        text = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {name: float(ns) * 1e-9 for name, ns in (line.split() for line in text.splitlines())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--no-cpp", action="store_true", help="skip the native C++ column")
    args = ap.parse_args()
    py, nb = bench_side_by_side()
    cc = {} if args.no_cpp else run_cpp()
    extra = numpy_tokens()
    print(
        f"# pagedkv {pagedkv.__version__} | {platform.processor() or platform.machine()} | "
        f"{NUM_BLOCKS} blocks x {BLOCK_SIZE} tokens, 4096 cached, prompts {PROMPT_LEN} tokens"
    )
    print(
        f"| {'operation':22} | {'Python (us)':>11} | {'pagedkv py (us)':>15} | "
        f"{'C++ core (us)':>13} | {'py/pagedkv':>10} | {'py/C++':>8} |"
    )
    print(f"|{'-' * 24}|{'-' * 13}:|{'-' * 17}:|{'-' * 15}:|{'-' * 12}:|{'-' * 10}:|")
    for name in py:
        c = cc.get(name)
        c_txt = f"{c * 1e6:13.3f}" if c else f"{'-':>13}"
        r_txt = f"{py[name] / c:7.0f}x" if c else f"{'-':>8}"
        print(
            f"| {name:22} | {py[name] * 1e6:11.2f} | {nb[name] * 1e6:15.2f} | {c_txt} | "
            f"{py[name] / nb[name]:9.1f}x | {r_txt} |"
        )

    print(
        f"pagedkv with 1-D int32 numpy tokens (read in place, no list conversion): "
        f"match_prefix_1k_hit {extra['hit'] * 1e6:.2f} us, "
        f"match_prefix_1k_miss {extra['miss'] * 1e6:.2f} us"
    )


def numpy_tokens() -> dict[str, float]:
    import numpy as np

    rng = random.Random(1)
    a = BlockAllocator(NUM_BLOCKS, BLOCK_SIZE)
    p = [rng.randrange(50000) for _ in range(PROMPT_LEN)]
    cache_prompt(a, p, None)
    hit = np.array(p + [1], dtype=np.int32)
    miss = np.array([rng.randrange(50000) for _ in range(PROMPT_LEN)], dtype=np.int32)
    return {
        "hit": time_per_call(lambda: a.free(a.match_prefix(hit))),
        "miss": time_per_call(lambda: a.match_prefix(miss)),
    }


if __name__ == "__main__":
    main()
