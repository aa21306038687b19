"""Shared helpers of the scheduler tests: a plan checker written from the metadata contract
(docs/metadata.md) and a driver that plays the model and remembers every request's tokens."""

from __future__ import annotations

import random
from typing import Optional

import numpy as np


def check_plan(sched, plan, expected_tokens: dict[str, list[int]]) -> None:
    """Asserts every array of `plan` against the contract, from first principles."""
    cfg = sched.config
    bs = cfg.block_size
    n, t = plan.num_seqs, plan.num_tokens
    assert t <= cfg.max_num_batched_tokens
    assert n <= cfg.max_num_seqs
    ids = plan.request_ids
    assert len(ids) == n and len(set(ids)) == n
    qsl, ssl = plan.query_start_loc, plan.seq_start_loc
    q = np.diff(qsl)
    assert qsl[0] == 0 and qsl[-1] == t and (q >= 1).all()
    assert ssl[0] == 0 and (np.diff(ssl) == plan.seq_lens).all()
    assert (plan.seq_lens == plan.context_lens + q).all()
    assert plan.input_ids.shape == (t,) and plan.positions.dtype == np.int64
    assert plan.block_tables.shape == (n, cfg.max_blocks_per_seq)
    npf = plan.num_prefills
    assert (q[npf:] == 1).all(), "decodes come after prefills and feed one token"
    assert plan.num_prefill_tokens == qsl[npf] and plan.num_decode_tokens == t - qsl[npf]
    assert plan.max_query_len == (q.max() if n else 0)
    assert plan.max_prefill_seq_len == (plan.seq_lens[:npf].max() if npf else 0)
    assert plan.max_decode_seq_len == (plan.seq_lens[npf:].max() if n > npf else 0)
    slots = []
    for i, rid in enumerate(ids):
        toks = expected_tokens[rid]
        lo, hi = int(qsl[i]), int(qsl[i + 1])
        pos = np.arange(plan.context_lens[i], plan.seq_lens[i])
        assert (plan.positions[lo:hi] == pos).all()
        assert (plan.input_ids[lo:hi] == np.asarray(toks, dtype=np.int64)[pos]).all()
        row = plan.block_tables[i]
        want = row[pos // bs].astype(np.int64) * bs + pos % bs
        assert (plan.slot_mapping[lo:hi] == want).all()
        samples = plan.seq_lens[i] == len(toks)
        assert plan.sample_indices[i] == (hi - 1 if samples else -1)
        slots.extend(plan.slot_mapping[lo:hi].tolist())
    assert len(set(slots)) == len(slots), "two tokens write the same cache slot"


class KvModel:
    """Plays the KV cache: each slot holds the (token, position) written there. Applies a
    plan's swaps and copies in the documented order, writes the fed tokens, then checks that
    every entry's whole context reads back its own tokens through its block table."""

    def __init__(self, cfg) -> None:
        self.bs = cfg.block_size
        self.dev = np.full((cfg.num_blocks * self.bs, 2), -1, dtype=np.int64)
        self.host = np.full((max(cfg.num_cpu_blocks, 1) * self.bs, 2), -1, dtype=np.int64)

    def _move(self, dst: np.ndarray, src: np.ndarray, pairs: np.ndarray) -> None:
        b = self.bs
        for s, d in pairs.tolist():  # in recorded order
            dst[d * b : (d + 1) * b] = src[s * b : (s + 1) * b]

    def run(self, plan, expected_tokens: dict[str, list[int]]) -> None:
        self._move(self.host, self.dev, plan.blocks_to_swap_out)
        self._move(self.dev, self.host, plan.blocks_to_swap_in)
        self._move(self.dev, self.dev, plan.blocks_to_copy)
        self.dev[plan.slot_mapping, 0] = plan.input_ids
        self.dev[plan.slot_mapping, 1] = plan.positions
        for i, rid in enumerate(plan.request_ids):
            pos = np.arange(plan.seq_lens[i])
            slots = plan.block_tables[i][pos // self.bs].astype(np.int64) * self.bs + pos % self.bs
            want = np.asarray(expected_tokens[rid][: len(pos)], dtype=np.int64)
            assert (self.dev[slots, 1] == pos).all(), f"{rid}: KV of a wrong position"
            assert (self.dev[slots, 0] == want).all(), f"{rid}: KV of a wrong token"


class Driver:
    """Feeds fake sampled tokens, tracks what each request must contain, checks every plan."""

    def __init__(
        self, sched, seed: int = 0, eos: Optional[int] = None, eos_rate: float = 0.0
    ) -> None:
        self.s, self.rng = sched, random.Random(seed)
        self.eos, self.eos_rate = eos, eos_rate
        self.tokens: dict[str, list[int]] = {}
        self.params: dict[str, dict] = {}
        self.finished: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}
        self.plans = 0
        self.kv = KvModel(sched.config)

    def add(self, rid: str, prompt: list[int], max_tokens: int, **kw) -> None:
        self.s.add_request(rid, prompt, max_tokens, eos_token_id=self.eos, **kw)
        self.tokens[rid] = list(prompt)
        self.prompt_len[rid] = len(prompt)
        self.params[rid] = dict(max_tokens=max_tokens, **kw)

    def abort(self, rid: str) -> None:
        assert self.s.abort_request(rid)
        del self.tokens[rid]

    def _sample(self) -> int:
        if self.eos is not None and self.rng.random() < self.eos_rate:
            return self.eos
        return self.rng.randrange(10, 30000)

    def step(self):
        plan = self.s.schedule()
        check_plan(self.s, plan, self.tokens)
        self.kv.run(plan, self.tokens)
        ids = plan.request_ids
        sampled = np.full(plan.num_seqs, -1, dtype=np.int64)
        for i, rid in enumerate(ids):
            if plan.sample_indices[i] >= 0:
                sampled[i] = self._sample()
                self.tokens[rid].append(int(sampled[i]))
        self.plans += 1
        done = [f.request_id for f in self.s.update(plan, sampled)]
        for rid in done:
            toks = self.tokens.pop(rid)
            gen = len(toks) - self.prompt_len[rid]
            stop = self.eos is not None and toks[-1] == self.eos
            assert gen == self.params[rid]["max_tokens"] or stop, (rid, gen)
            self.finished[rid] = toks
        for rid, toks in self.tokens.items():
            assert self.s.get_token_ids(rid) == toks, f"tokens of {rid} changed"
        return ids, done

    def run_to_end(self, max_steps: int = 100_000) -> None:
        for _ in range(max_steps):
            if not self.s.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("no progress")
