"""Drives the real BlockAllocator and the reference model with the same random operations the
way a scheduler would (prompts with prefix reuse, decode appends with copy-on-write, fork,
swap, finish, bad calls), tracking what each physical block holds, and checks after every
operation that both agree and that no block is leaked, handed out twice or freed while held.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from pagedkv import BlockAllocator

from support.allocator_reference import ROOT, AllocatorModel, Hash, ModelError


@dataclass
class Seq:
    ids: list[int]  # device blocks, one reference each (empty while swapped out)
    tokens: list[int] = field(default_factory=list)  # tokens written so far
    extra: int = 0
    hashes: list[Hash] = field(default_factory=list)  # chain of its full, registered blocks
    cpu: list[int] | None = None  # host blocks while swapped out


class Harness:
    def __init__(
        self, num_blocks: int, block_size: int, num_cpu_blocks: int, prefix_caching: bool, seed: int
    ) -> None:
        self.real = BlockAllocator(num_blocks, block_size, num_cpu_blocks, prefix_caching)
        self.model = AllocatorModel(num_blocks, block_size, num_cpu_blocks, prefix_caching)
        self.bs = block_size
        self.rng = random.Random(seed)
        self.seqs: list[Seq] = []
        self.content: dict[int, list[int]] = {}  # device block -> tokens it physically holds
        self.host: dict[int, list[int]] = {}
        # A few base prompts over a tiny vocabulary, so prefixes and partial matches recur.
        self.bases = [[self.rng.randrange(3) for _ in range(5 * block_size + 3)] for _ in range(3)]
        self.ops = 0

    # ---- plumbing ---------------------------------------------------------------------------
    def both(self, real_call, model_call):
        """Runs the model, then the real call; a model failure must be the same real failure."""
        try:
            expected = model_call()
        except ModelError as e:
            exc = ValueError if e.kind == "value" else MemoryError
            with pytest.raises(exc):
                real_call()
            return None, None
        return real_call(), expected

    def sync_copies(self) -> None:
        got = [tuple(p) for p in self.real.take_pending_copies().tolist()]
        assert got == self.model.take_copies()
        for src, dst in got:  # executed in call order, as the model runner would
            self.content[dst] = list(self.content.get(src, []))

    def write(self, seq: Seq, t: int) -> None:
        j, pos = divmod(len(seq.tokens), self.bs)
        b = seq.ids[j]
        assert self.model.ref[b] == 1, "writing into a shared block"
        self.content[b] = self.content.get(b, [])[:pos] + [t]
        seq.tokens.append(t)
        if len(seq.tokens) % self.bs == 0 and len(seq.hashes) == j:
            self.register(seq, j)

    def register(self, seq: Seq, j: int) -> None:
        parent = seq.hashes[-1] if seq.hashes else ROOT
        block = seq.tokens[j * self.bs : (j + 1) * self.bs]
        got, want = self.both(
            lambda: self.real.cache_full_block(seq.ids[j], parent, block, seq.extra),
            lambda: self.model.cache_full_block(seq.ids[j], parent, block, seq.extra),
        )
        assert got == want
        seq.hashes.append(want)

    def pick(self) -> Seq | None:
        live = [s for s in self.seqs if s.cpu is None]
        return self.rng.choice(live) if live else None

    # ---- operations ---------------------------------------------------------------------------
    def op_prompt(self) -> None:
        rng, bs = self.rng, self.bs
        base = rng.choice(self.bases)
        tokens = base[: rng.randrange(1, len(base))] + [
            rng.randrange(3) for _ in range(rng.randrange(3))
        ]
        extra = rng.choice((0, 0, 0, 7))
        n = len(tokens)
        peek = self.real.peek_prefix(tokens, extra, (n - 1) // bs)
        if bs > 1 and rng.random() < 0.5:
            ids, k = self.match_partial(tokens, extra)
        else:
            ids = self.real.match_prefix(tokens, extra, (n - 1) // bs)
            want, hashes = self.model.match_prefix(tokens, extra, (n - 1) // bs)
            assert ids == want and peek == len(ids)
            k = len(ids) * bs
        full = k // bs
        for i in range(full):  # never a wrong block: matched blocks hold these tokens
            assert self.content[ids[i]] == tokens[i * bs : (i + 1) * bs]
        seq = Seq(ids, tokens[:k], extra)
        seq.hashes = [self.real.block_hash(b) or self.model_hash(b) for b in ids[:full]]
        need = -(-n // bs) - len(ids)
        more, want_more = self.both(
            lambda: self.real.allocate(need), lambda: self.model.allocate(need)
        )
        if want_more is None:
            self.release(ids)
            return
        assert more == want_more
        seq.ids += more
        self.seqs.append(seq)
        for t in tokens[k:]:
            self.write(seq, t)

    def model_hash(self, b: int) -> Hash:
        raise AssertionError(f"matched block {b} has no cached hash")

    def match_partial(self, tokens: list[int], extra: int) -> tuple[list[int], int]:
        bs, n = self.bs, len(tokens)
        ids, k = self.real.match_prefix_partial(tokens, extra, max_tokens=n - 1)
        pend = [tuple(p) for p in self.real.take_pending_copies().tolist()]
        want, hashes = self.model.match_prefix(tokens, extra, (n - 1) // bs)
        done = len(want) * bs
        assert ids[: len(want)] == want
        rest = tokens[done:]
        wanted = min(n - 1 - done, bs - 1)
        best, who = (
            self.model.partial_candidates(hashes[-1] if hashes else ROOT, rest, wanted, extra)
            if wanted > 0 and self.model.queue
            else (0, [])
        )
        if best == 0:
            assert (k, len(ids), pend) == (done, len(want), [])
            return ids, k
        src, dst = pend[-1]
        assert src in who and k == done + best
        assert self.content[src][:best] == tokens[done : done + best]
        assert self.model.match_partial_apply(src) == dst == ids[-1]
        self.model.hits_tokens += best
        assert self.model.take_copies() == pend
        self.content[dst] = list(self.content[src])
        return ids, k

    def release(self, ids: list[int]) -> None:
        got, want = self.both(lambda: self.real.free(ids), lambda: self.model.free(ids))
        assert got is None and want is None

    def op_append(self) -> None:
        seq = self.pick()
        if seq is None or not seq.tokens:
            return
        if len(seq.tokens) == len(seq.ids) * self.bs:
            got, want = self.both(lambda: self.real.allocate(1), lambda: self.model.allocate(1))
            if want is None:
                return
            assert got == want
            seq.ids += got
        else:
            last = seq.ids[-1]
            got, want = self.both(
                lambda: self.real.copy_on_write(last), lambda: self.model.copy_on_write(last)
            )
            if want is None:
                return
            assert got == want
            self.sync_copies()
            seq.ids[-1] = got[0]
        self.write(seq, self.rng.randrange(3))

    def op_fork(self) -> None:
        seq = self.pick()
        if seq is None:
            return
        self.both(lambda: self.real.fork(seq.ids), lambda: self.model.fork(seq.ids))
        self.seqs.append(Seq(list(seq.ids), list(seq.tokens), seq.extra, list(seq.hashes)))

    def op_finish(self) -> None:
        if not self.seqs:
            return
        seq = self.seqs.pop(self.rng.randrange(len(self.seqs)))
        if seq.cpu is not None:
            self.both(lambda: self.real.free_cpu(seq.cpu), lambda: self.model.free_cpu(seq.cpu))
        else:
            self.release(seq.ids)

    def op_swap(self) -> None:
        seq = self.rng.choice(self.seqs) if self.seqs else None
        if seq is None:
            return
        if seq.cpu is None:
            got, want = self.both(
                lambda: self.real.swap_out(seq.ids), lambda: self.model.swap_out(seq.ids)
            )
            if want is None:
                return
            assert got[0] == want and got[1].tolist() == [[d, h] for d, h in zip(seq.ids, want)]
            for d, h in zip(seq.ids, want):
                self.host[h] = list(self.content.get(d, []))
            seq.ids, seq.cpu = [], want
        else:
            got, want = self.both(
                lambda: self.real.swap_in(seq.cpu), lambda: self.model.swap_in(seq.cpu)
            )
            if want is None:
                return
            assert got[0] == want and got[1].tolist() == [[h, d] for h, d in zip(seq.cpu, want)]
            for h, d in zip(seq.cpu, want):
                self.content[d] = list(self.host[h])
            seq.ids, seq.cpu = want, None

    def op_cow_any(self) -> None:
        seq = self.pick()
        if seq is None or not seq.ids:
            return
        j = self.rng.randrange(len(seq.ids))
        got, want = self.both(
            lambda: self.real.copy_on_write(seq.ids[j]),
            lambda: self.model.copy_on_write(seq.ids[j]),
        )
        if want is not None:
            assert got == want
            self.sync_copies()
            seq.ids[j] = want[0]

    def op_raw(self) -> None:
        n = self.rng.randrange(0, self.model.num_blocks // 2 + 2)
        got, want = self.both(lambda: self.real.allocate(n), lambda: self.model.allocate(n))
        if want is not None:
            assert got == want
            for b in got:
                self.content[b] = []
            self.seqs.append(Seq(got))

    def op_bad(self) -> None:
        rng, m = self.rng, self.model
        held = [b for s in self.seqs for b in s.ids]
        free_ids = list(m.queue)
        b = rng.choice(held) if held else -1
        cases = [
            lambda: [rng.choice(free_ids)] if free_ids else [m.num_blocks],
            lambda: [m.num_blocks + rng.randrange(3)],
            lambda: [-1 - rng.randrange(3)],
            lambda: [b] * (m.ref[b] + 1) if held else [-1],
        ]
        kind = rng.randrange(4)
        ids = rng.choice(cases if kind == 0 else cases[:3])()  # over-listing is only bad in free
        if kind == 0:
            self.both(lambda: self.real.free(ids), lambda: self.model.free(ids))
        elif kind == 1:
            self.both(lambda: self.real.fork(ids), lambda: self.model.fork(ids))
        elif kind == 2:
            self.both(
                lambda: self.real.copy_on_write(ids[0]), lambda: self.model.copy_on_write(ids[0])
            )
        else:
            cpu = (
                [m.num_cpu_blocks + 1]
                if rng.random() < 0.5
                else [c for c in range(m.num_cpu_blocks) if m.cpu_ref[c] == 0][:1] or [-1]
            )
            self.both(lambda: self.real.swap_in(cpu), lambda: self.model.swap_in(cpu))
        self.sync_copies()

    def op_reset(self) -> None:
        self.real.reset_prefix_cache()
        self.model.reset_prefix_cache()

    WEIGHTS = {
        "op_prompt": 6,
        "op_append": 8,
        "op_fork": 2,
        "op_finish": 5,
        "op_swap": 2,
        "op_cow_any": 1,
        "op_raw": 1,
        "op_bad": 1,
        "op_reset": 0.05,
    }

    def step(self) -> None:
        names = list(self.WEIGHTS)
        name = self.rng.choices(names, weights=[self.WEIGHTS[n] for n in names])[0]
        getattr(self, name)()
        self.sync_copies()
        self.ops += 1
        self.check()

    # ---- invariants ---------------------------------------------------------------------------
    def check(self) -> None:
        m, r = self.model, self.real
        held = Counter(b for s in self.seqs for b in s.ids)
        refs = [r.ref_count(b) for b in range(m.num_blocks)]
        assert refs == m.ref
        # Every reference belongs to a live sequence: nothing leaked, nothing handed out twice.
        assert all(refs[b] == held.get(b, 0) for b in range(m.num_blocks))
        host = Counter(c for s in self.seqs if s.cpu for c in s.cpu)
        assert all(r.cpu_ref_count(c) == host.get(c, 0) for c in range(m.num_cpu_blocks))
        assert r.num_free_blocks == len(m.queue) == m.num_blocks - len(held)
        assert r.num_free_cpu_blocks == len(m.cpu_free)
        assert r.num_cached_blocks == len(m.table)
        assert r.num_cached_free_blocks == m.num_cached_free
        s = r.stats()
        assert (s["evictions"], s["prefix_hits_tokens"], s["prefix_queries_tokens"]) == (
            m.evictions,
            m.hits_tokens,
            m.query_tokens,
        )
        # Prefix-cache invariant: a cached block holds exactly the tokens it is cached under.
        for b, meta in m.meta.items():
            assert r.block_hash(b) == meta.hash
            assert self.content[b] == list(meta.tokens)
        assert r.check_invariants() == ""
