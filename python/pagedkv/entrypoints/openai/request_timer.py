"""RequestTimer: the server-side latency of one request, for the metrics and the log line."""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any, Optional, Sequence

from pagedkv.entrypoints.openai.metrics import ServerMetrics

logger = logging.getLogger("pagedkv.server")


class RequestTimer:
    """Server-side latency of one request, for the metrics histograms and the log line."""

    def __init__(self, metrics: ServerMetrics, request_id: str) -> None:
        self.metrics = metrics
        self.request_id = request_id
        self.start = time.perf_counter()
        self.first: Optional[float] = None
        self.last: Optional[float] = None

    def token(self, choice: int = 0) -> None:
        """New tokens of response choice ``choice`` arrived; the intervals between the first
        choice's arrivals are the inter-token latencies."""
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        if choice != 0:
            return
        if self.last is not None:
            self.metrics.observe_token_interval(now - self.last)
        self.last = now

    def done(
        self,
        num_tokens: int,
        finish_reasons: Sequence[Optional[str]],
        prompt_tokens: int = 0,
        outputs: Sequence[Any] = (),
    ) -> None:
        """``outputs``: the request's latest RequestOutputs (their engine milestones)."""
        end = time.perf_counter()
        ttft = (self.first or end) - self.start
        tpot = (end - (self.first or end)) / (num_tokens - 1) if num_tokens > 1 else None
        first = next((o for o in outputs if o is not None), None)
        self.metrics.observe_request(
            ttft,
            tpot,
            end - self.start,
            finish_reasons,
            prompt_tokens,
            num_tokens,
            getattr(first, "metrics", None),
        )
        # Reasons with their counts, so that a request with many choices logs one short line.
        counts = Counter(str(r) for r in finish_reasons)
        logger.info(
            "finished %s: completion_tokens=%d finish=%s ttft=%.3fs e2e=%.3fs",
            self.request_id,
            num_tokens,
            ",".join(f"{r}x{k}" if k > 1 else r for r, k in counts.items()),
            ttft,
            end - self.start,
        )
