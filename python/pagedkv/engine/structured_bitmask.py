"""The token bitmask of a step's structured-output rows, filled on the host off the step's
critical path and applied on the device without a host wait.

A decode step of a small model is mostly host work (schedule, metadata, launch, sampling,
output processing), so filling the bitmask on the main thread, even while the device runs the
forward, lengthens every step by the fill. Instead, once a step's tokens are applied
(EngineCore._apply: ``accept_later`` queues each constrained token, whether it ends its grammar
is known from the grammar's stop tokens; ``accept_queued`` has the matchers take them in one
xgrammar call), ``prefetch`` starts filling the next bitmask of the running sequences in a
worker thread: xgrammar's batch fill runs in C++ without the GIL, while the main thread
processes the outputs, schedules and launches the next forward. ``take`` then hands the sampled
rows their rows of that bitmask (a row filled from a matcher that has taken every token of its
sample; any other row is filled there and then), copied from a pinned buffer into a persistent
device buffer without waiting for the device, for xgrammar's in-place kernel.

The tokens are taken on the main thread: a worker that must take the GIL back between two
xgrammar calls waits up to the interpreter's switch interval (5 ms) for a busy main thread.
The matchers are the worker's from ``prefetch`` until ``wait`` (take() waits).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from pagedkv.engine.model_runner import to_device
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.structured_output import GrammarCache, accept_tokens, refused_token_error

# The prefetched rows in order: (sample, its matcher, how many tokens it had taken).
_Rows = List[Tuple[SeqState, Any, int]]


class StructuredBitmask:
    """Per engine: the prefetch worker and the host / device buffers of up to ``max_rows``
    rows (bigger batches, e.g. n > 1 fan-outs, are filled at ``take`` in fresh tensors)."""

    def __init__(self, grammars: GrammarCache, max_rows: int) -> None:
        self.grammars, self.max_rows = grammars, max(1, int(max_rows))
        self.words = (grammars.vocab_size + 31) // 32
        self._worker: Optional[ThreadPoolExecutor] = None  # made at the first prefetch
        # The prefetch under way or not yet taken: (its future, its rows, its host buffer).
        self._pending: Optional[Tuple[Future, _Rows, torch.Tensor]] = None
        self._pin = False  # the buffers are pinned (once a step ran on a CUDA device)
        # [max_rows, words] int32: the prefetch fills ``_filled``, take() gathers rows into
        # ``_gathered`` when the step's rows are not the prefetched ones in order.
        self._filled: Optional[torch.Tensor] = None
        self._gathered: Optional[torch.Tensor] = None
        # The device copy last made out of each host buffer (CUDA event): it must complete
        # before the buffer is written again.
        self._copied: Dict[str, Any] = {}
        self._device: Dict[str, torch.Tensor] = {}  # str(device) -> [max_rows, words] int32
        self.prefetched = 0  # rows served from a prefetch (tests and benchmarks read it)
        # (request, matcher, token) applied since accept_queued last ran
        self._accepts: List[Tuple[RequestState, Any, int]] = []

    # ------------------------------------------------------------------ tokens
    def accept_later(self, req: RequestState, seq: SeqState, token: int) -> bool:
        """Queues ``token`` for ``seq``'s matcher (taken by accept_queued); True when it ends
        the grammar (the sample is complete: a matcher terminates exactly on a stop token)."""
        self._accepts.append((req, seq.matcher, token))
        return token in self.grammars.stop_token_ids

    def drop_queued(self) -> None:
        """Forgets tokens queued by a step that failed while applying them (its requests were
        aborted); waits for the worker, which is then done with the matchers."""
        self.wait()
        self._accepts = []

    def accept_queued(self) -> List[Tuple[RequestState, Exception]]:
        """The matchers take the queued tokens (one xgrammar call); returns the requests whose
        matcher refused its token (sampled outside its bitmask: an engine bug), with the
        error."""
        self.wait()
        accepts, self._accepts = self._accepts, []
        if not accepts:
            return []
        try:
            bad = accept_tokens([m for _, m, _ in accepts], [t for _, _, t in accepts])
        except Exception as exc:  # every matcher in doubt: their requests fail
            return [(req, exc) for req, _, _ in accepts]
        return [(accepts[i][0], refused_token_error(accepts[i][2])) for i in bad]

    # ------------------------------------------------------------------ prefetch
    def prefetch(self, seqs: Sequence[SeqState]) -> None:
        """Starts filling the next bitmask of ``seqs`` (those still running; their matchers
        took every token so far) in the worker thread."""
        self.wait()
        seqs = [s for s in seqs if s.matcher is not None and not s.finished][: self.max_rows]
        if not seqs:
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="pagedkv-bitmask")
        rows: _Rows = [(s, s.matcher, len(s.token_ids)) for s in seqs]
        # Everything but xgrammar's call is done here, so that the worker holds the GIL for
        # as short as possible.
        last = self._copied.pop("_filled", None)
        if last is not None:  # (the last copy out of the buffer: done in practice)
            last.synchronize()
        host = self._buffer("_filled")
        # Every row is written by xgrammar: a running sample's matcher has not terminated (it
        # would have ended the sample); were one terminated, the fill raises and take() fills
        # the rows itself.
        started = threading.Event()
        pending = self._worker.submit(self._fill, [s.matcher for s in seqs], host, started)
        self._pending = (pending, rows, host)
        # Hand the GIL over until the worker is in xgrammar's call (which releases it):
        # otherwise it may wait the interpreter's switch interval (5 ms) to start.
        started.wait()

    def _fill(self, matchers: List[Any], host: torch.Tensor, started: threading.Event) -> None:
        """Worker thread: row i of ``host`` from ``matchers[i]``."""
        started.set()
        self.grammars.fill_rows(matchers, host, list(range(len(matchers))))

    def wait(self) -> Tuple[_Rows, Optional[torch.Tensor]]:
        """Waits for the prefetch under way: its rows and the host bitmask holding them ([]
        if none, or if it raised: take() then fills those rows itself and reports the error)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return [], None
        future, rows, host = pending
        try:
            future.result()
        except Exception:
            return [], None
        return rows, host

    # ------------------------------------------------------------------ take
    def take(
        self, seqs: Sequence[Optional[SeqState]], device: torch.device
    ) -> Optional[torch.Tensor]:
        """[len(seqs), words] int32 bitmask on ``device`` of the sampled rows (None entries and
        rows without a matcher allow every token), or None when no row is constrained."""
        if all(s is None or s.matcher is None for s in seqs):
            return None
        self._pin = self._pin or device.type == "cuda"
        ready, filled = self.wait()
        n = len(seqs)
        if (
            filled is not None
            and n == len(ready)
            and all(
                s is p and s.matcher is m and len(s.token_ids) == k
                for s, (p, m, k) in zip(seqs, ready)
            )
        ):  # the common decode step: the prefetched rows, in order
            self.prefetched += n
            return self._to_device("_filled", filled[:n], device)
        at = {id(p): (i, m, k) for i, (p, m, k) in enumerate(ready)}
        src: List[int] = []  # row in the prefetched bitmask, -1: none (all allowed), -2: fill
        for s in seqs:
            hit = at.get(id(s)) if s is not None else None
            if s is None or s.matcher is None:
                src.append(-1)
            elif hit is not None and hit[1] is s.matcher and hit[2] == len(s.token_ids):
                src.append(hit[0])
            else:
                src.append(-2)
        self.prefetched += sum(i >= 0 for i in src)
        if n > self.max_rows:
            host = torch.full((n, self.words), -1, dtype=torch.int32)
        else:
            last = self._copied.pop("_gathered", None)
            if last is not None:  # (the last step's copy: done in practice, it sampled since)
                last.synchronize()
            host = self._buffer("_gathered")[:n]
            host.fill_(-1)
        have = [j for j, i in enumerate(src) if i >= 0]
        if have:
            assert filled is not None
            host[have] = filled[[src[j] for j in have]]
        fill = [j for j, i in enumerate(src) if i == -2]
        if fill:
            matchers = [seqs[j].matcher for j in fill]  # type: ignore[union-attr]
            got = self.grammars.fill_bitmask(matchers)
            assert got is not None
            host[fill] = got
        if n > self.max_rows:
            return to_device(host, device)
        return self._to_device("_gathered", host, device)

    def apply(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        """Disallowed tokens of ``mask`` (take()'s rows) -> -inf in ``logits``, in place."""
        self.grammars.apply_bitmask(logits, mask)

    def _to_device(self, name: str, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``host`` (rows of buffer ``name``) on ``device``: an asynchronous copy from pinned
        memory into the persistent device buffer (xgrammar's kernel then reads it in order)."""
        if device.type == "cpu":
            return host
        key = str(device)
        dev = self._device.get(key)
        if dev is None:
            dev = self._device[key] = torch.empty(
                (self.max_rows, self.words), dtype=torch.int32, device=device
            )
        out = dev[: host.shape[0]]
        out.copy_(host, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._copied[name] = event
        return out

    def _buffer(self, name: str) -> torch.Tensor:
        """Host buffer ``name``, pinned once a CUDA step was seen (re-made then)."""
        buf: Optional[torch.Tensor] = getattr(self, name)
        if buf is None or (self._pin and not buf.is_pinned()):
            if buf is not None and name in self._copied:
                self._copied.pop(name).synchronize()
            buf = torch.full((self.max_rows, self.words), -1, dtype=torch.int32)
            buf = buf.pin_memory() if self._pin else buf
            setattr(self, name, buf)
        return buf
