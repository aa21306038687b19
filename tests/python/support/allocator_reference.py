"""A plain-Python reference model of BlockAllocator, written from the documented semantics.

It predicts every id the allocator hands out (free-queue order: uncached free blocks first,
cached ones least recently freed first, a sequence's blocks released tail first), every ref
count, the prefix-cache contents and the host pool. Only the choice among equally good partial
matches is left open (the model accepts any of them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pagedkv._C import hash_block

Hash = tuple[int, int]
ROOT: Hash = (0, 0)


class ModelError(Exception):
    """The call must fail; `kind` is 'value' (ValueError) or 'memory' (MemoryError)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass
class CachedBlock:
    hash: Hash
    parent: Hash
    tokens: tuple[int, ...]
    extra: int


@dataclass
class AllocatorModel:
    num_blocks: int
    block_size: int
    num_cpu_blocks: int = 0
    prefix_caching: bool = True
    ref: list[int] = field(init=False)
    queue: OrderedDict[int, None] = field(init=False)  # free blocks, head = next reused
    meta: dict[int, CachedBlock] = field(init=False)  # cached blocks
    table: dict[Hash, int] = field(init=False)
    cpu_ref: list[int] = field(init=False)
    cpu_free: list[int] = field(init=False)  # stack, top = end
    copies: list[tuple[int, int]] = field(init=False)
    pins: list[int] = field(init=False)  # copy sources kept referenced until take_copies()
    evictions: int = 0
    hits_tokens: int = 0
    query_tokens: int = 0

    def __post_init__(self) -> None:
        self.ref = [0] * self.num_blocks
        self.queue = OrderedDict((i, None) for i in range(self.num_blocks))
        self.meta, self.table, self.copies, self.pins = {}, {}, [], []
        self.cpu_ref = [0] * self.num_cpu_blocks
        self.cpu_free = list(reversed(range(self.num_cpu_blocks)))

    # ---- pool -------------------------------------------------------------------------------
    def _pop(self) -> int:
        b, _ = self.queue.popitem(last=False)
        if b in self.meta:
            self._uncache(b)
            self.evictions += 1
        self.ref[b] = 1
        return b

    def _uncache(self, b: int) -> None:
        m = self.meta.pop(b)
        if self.table.get(m.hash) == b:
            del self.table[m.hash]

    def _enqueue(self, b: int) -> None:
        self.queue[b] = None
        if b not in self.meta:
            self.queue.move_to_end(b, last=False)

    def _acquire(self, b: int) -> None:
        if self.ref[b] == 0:
            del self.queue[b]
        self.ref[b] += 1

    def _check_release(self, ids: list[int], refs: list[int]) -> None:
        need: dict[int, int] = {}
        for b in ids:
            if not 0 <= b < len(refs):
                raise ModelError("value")
            need[b] = need.get(b, 0) + 1
            if need[b] > refs[b]:
                raise ModelError("value")

    def _release(self, ids: list[int]) -> None:
        self._check_release(ids, self.ref)
        for b in ids:
            self.ref[b] -= 1
        for b in reversed(ids):
            if self.ref[b] == 0 and b not in self.queue:
                self._enqueue(b)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ModelError("value")
        if n > len(self.queue):
            raise ModelError("memory")
        return [self._pop() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        self._release(ids)

    def fork(self, ids: list[int]) -> None:
        if any(not 0 <= b < self.num_blocks or self.ref[b] == 0 for b in ids):
            raise ModelError("value")
        for b in ids:
            self.ref[b] += 1

    def copy_on_write(self, b: int) -> tuple[int, bool]:
        if not 0 <= b < self.num_blocks or self.ref[b] == 0:
            raise ModelError("value")
        if self.ref[b] == 1 and b not in self.meta:
            return b, False
        if not self.queue:
            raise ModelError("memory")
        dst = self._pop()
        if self.ref[b] == 1:
            self.pins.append(b)  # its last reference: kept until the copy is taken
        else:
            self._release([b])
        self.copies.append((b, dst))
        return dst, True

    def take_copies(self) -> list[tuple[int, int]]:
        out, self.copies = self.copies, []
        for b in self.pins:
            self._release([b])
        self.pins = []
        return out

    # ---- prefix cache -------------------------------------------------------------------------
    def _lookup(self, h: Hash, parent: Hash, toks: tuple[int, ...], extra: int) -> int | None:
        b = self.table.get(h)
        if b is None:
            return None
        m = self.meta[b]
        return b if (m.parent, m.tokens, m.extra) == (parent, toks, extra) else None

    def match_prefix(
        self, tokens: list[int], extra: int = 0, max_blocks: int | None = None
    ) -> tuple[list[int], list[Hash]]:
        if not self.prefix_caching:
            return [], []
        bs = self.block_size
        limit = len(tokens) // bs if max_blocks is None else min(len(tokens) // bs, max_blocks)
        ids, hashes, h = [], [], ROOT
        for i in range(limit):
            toks = tuple(tokens[i * bs : (i + 1) * bs])
            nh = hash_block(h, list(toks), extra)
            b = self._lookup(nh, h, toks, extra)
            if b is None:
                break
            self._acquire(b)
            ids.append(b)
            hashes.append(nh)
            h = nh
        self.query_tokens += len(tokens)
        self.hits_tokens += len(ids) * bs
        return ids, hashes

    def partial_candidates(
        self, parent: Hash, rest: list[int], want: int, extra: int
    ) -> tuple[int, list[int]]:
        """(best k, blocks achieving it) among cached children of `parent`; the last free
        block cannot be a source (the copy needs another free block)."""
        best, who = 0, []
        last_free = next(iter(self.queue)) if len(self.queue) == 1 else None
        for b, m in self.meta.items():
            if m.parent != parent or m.extra != extra or b == last_free:
                continue
            k = 0
            while k < want and m.tokens[k] == rest[k]:
                k += 1
            if k > best:
                best, who = k, [b]
            elif k == best and k > 0:
                who.append(b)
        return best, who

    def match_partial_apply(self, src: int) -> int:
        """Applies the partial reuse of cached block `src`; returns the fresh block."""
        self._acquire(src)
        dst = self._pop()
        self.pins.append(src)
        self.copies.append((src, dst))
        return dst

    def cache_full_block(self, b: int, parent: Hash, tokens: list[int], extra: int = 0) -> Hash:
        if not 0 <= b < self.num_blocks or self.ref[b] == 0:
            raise ModelError("value")
        h = hash_block(parent, tokens, extra)
        if not self.prefix_caching:
            return h
        if b in self.meta:
            if self.meta[b].hash != h:
                raise ModelError("value")
            return h
        if h not in self.table:
            self.table[h] = b
            self.meta[b] = CachedBlock(h, parent, tuple(tokens), extra)
        return h

    def reset_prefix_cache(self) -> None:
        self.meta.clear()
        self.table.clear()

    # ---- host pool ----------------------------------------------------------------------------
    def swap_out(self, ids: list[int]) -> list[int]:
        self._check_release(ids, self.ref)
        if len(ids) > len(self.cpu_free):
            raise ModelError("memory")
        self._release(ids)
        cpu = [self.cpu_free.pop() for _ in ids]
        for c in cpu:
            self.cpu_ref[c] = 1
        return cpu

    def free_cpu(self, cpu: list[int]) -> None:
        self._check_release(cpu, self.cpu_ref)
        for c in cpu:
            self.cpu_ref[c] -= 1
        pushed = set()
        for c in reversed(cpu):
            if self.cpu_ref[c] == 0 and c not in pushed:
                self.cpu_free.append(c)
                pushed.add(c)

    def swap_in(self, cpu: list[int]) -> list[int]:
        if len(cpu) > len(self.queue):
            self._check_release(cpu, self.cpu_ref)
            raise ModelError("memory")
        self.free_cpu(cpu)
        return [self._pop() for _ in cpu]

    @property
    def num_cached_free(self) -> int:
        return sum(1 for b in self.meta if self.ref[b] == 0)
