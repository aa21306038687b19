"""N-gram prompt lookup (vLLM's ``method: "ngram"``): draft tokens copied from the sequence itself.

If the last n tokens of the sequence (prompt + output) occurred earlier in it, the tokens that
followed that earlier occurrence are proposed as the next ones. Input-grounded generation
(summarising, editing, code changes) repeats its input, so such drafts are often accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np


@dataclass(frozen=True)
class NgramProposer:
    """``prompt_lookup_min`` <= n <= ``prompt_lookup_max`` (vLLM's keys); at most
    ``num_speculative_tokens`` drafts."""

    prompt_lookup_min: int
    prompt_lookup_max: int
    num_speculative_tokens: int

    def __post_init__(self) -> None:
        for name in ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )

    def propose(self, token_ids: Sequence[int], max_tokens: int | None = None) -> List[int]:
        """Draft tokens for the sequence ``token_ids`` (may be empty). The longest n wins (a
        longer match predicts better); among its earlier occurrences the most recent one (the
        nearest context). ``max_tokens`` caps the drafts further (room left in the request)."""
        k = (
            self.num_speculative_tokens
            if max_tokens is None
            else min(self.num_speculative_tokens, max_tokens)
        )
        seq = np.asarray(token_ids, dtype=np.int64)
        if k <= 0 or len(seq) < self.prompt_lookup_min + 1:
            return []
        for n in range(min(self.prompt_lookup_max, len(seq) - 1), self.prompt_lookup_min - 1, -1):
            start = self._last_earlier_match(seq, n)
            if start >= 0:
                follow = seq[start + n : start + n + k]
                return [int(t) for t in follow]
        return []

    @staticmethod
    def _last_earlier_match(seq: np.ndarray, n: int) -> int:
        """Start of the last occurrence of seq's final n tokens that ends before the sequence
        does (so at least one token follows it), or -1."""
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        return int(hits[-1]) if len(hits) else -1
