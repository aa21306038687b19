"""Prometheus metrics of one server, named like vLLM's with the ``pagedkv:`` prefix.

Gauges and counters are read from the engine's stats snapshot at scrape time (a custom
collector, so values never drift from the engine's own counters); latency histograms are
observed by the request handlers. Each app has its own CollectorRegistry so several servers
(or tests) in one process do not collide.

Everything observed here is per HTTP request, as in vLLM: a request with ``n`` choices (or a
batch of prompts) is one observation of each latency histogram and, if it finished, one
``request_success`` count. Its ``finished_reason`` label is that of the response's first choice
(index 0); a request with any choice unfinished (the client went away, the engine failed) is
not a success and is not counted.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (engine stats key, metric name, kind, help)
_ENGINE_METRICS = (
    ("num_requests_running", "pagedkv:num_requests_running", "gauge",
     "Number of requests in the running batch."),
    ("num_requests_waiting", "pagedkv:num_requests_waiting", "gauge",
     "Number of requests waiting to be scheduled."),
    ("kv_cache_usage_perc", "pagedkv:kv_cache_usage_perc", "gauge",
     "Fraction of KV-cache blocks in use (1 = full)."),
    ("prefix_cache_queries", "pagedkv:prefix_cache_queries", "counter",
     "Prompt tokens looked up in the prefix cache."),
    ("prefix_cache_hits", "pagedkv:prefix_cache_hits", "counter",
     "Prompt tokens found in the prefix cache."),
    ("num_preemptions", "pagedkv:num_preemptions", "counter",
     "Requests preempted (recomputed later) for lack of KV blocks."),
    ("prompt_tokens", "pagedkv:prompt_tokens", "counter", "Prefill tokens processed."),
    ("generation_tokens", "pagedkv:generation_tokens", "counter", "Tokens generated."),
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                 1.0, 2.5, 5.0)


class _EngineCollector(Collector):
    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterable[Metric]:
        stats = self.engine.get_stats()
        for key, name, kind, doc in _ENGINE_METRICS:
            family_cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            family = family_cls(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(stats.get(key, 0) or 0))
            yield family
        dead = GaugeMetricFamily("pagedkv:engine_dead", "1 once the engine loop has died.",
                                 labels=["model_name"])
        dead.add_metric([self.model_name], 1.0 if self.engine.is_dead else 0.0)
        yield dead


def _one_two_five(limit: int) -> list:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    buckets: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > limit:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class ServerMetrics:
    def __init__(self, engine: Any, model_name: str, max_model_len: int = 8192) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        labels = ["model_name"]
        self.ttft = Histogram("pagedkv:time_to_first_token_seconds",
                              "Time from request arrival to its first token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("pagedkv:time_per_output_token_seconds",
                              "Mean time between output tokens of a request.", labels,
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("pagedkv:e2e_request_latency_seconds",
                             "Time from request arrival to its last token.", labels,
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        # Token counts per request (vLLM's names), for its dashboards' length panels.
        self.prompt_len = Histogram("pagedkv:request_prompt_tokens",
                                    "Prompt tokens of a request.", labels,
                                    buckets=_one_two_five(max_model_len), registry=self.registry)
        self.generation_len = Histogram("pagedkv:request_generation_tokens",
                                        "Tokens generated for a request (all its choices).",
                                        labels, buckets=_one_two_five(max_model_len),
                                        registry=self.registry)
        self.success = Counter("pagedkv:request_success",
                               "Finished requests, by the finish reason of their first choice.",
                               labels + ["finished_reason"], registry=self.registry)
        # Exported from the start with zero counts, as vLLM's are: a scrape before the first
        # request sees every series (dashboards show 0, not "no data").
        for histogram in (self.ttft, self.tpot, self.e2e, self.prompt_len, self.generation_len):
            histogram.labels(model_name)
        for reason in ("stop", "length"):
            self.success.labels(model_name, reason)

    def observe_request(self, ttft: float, tpot: Optional[float], e2e: float,
                        finish_reasons: Sequence[Optional[str]], prompt_tokens: int = 0,
                        generation_tokens: int = 0) -> None:
        """One HTTP request; ``finish_reasons`` of its choices by index (None: unfinished)."""
        self.ttft.labels(self.model_name).observe(ttft)
        self.prompt_len.labels(self.model_name).observe(prompt_tokens)
        self.generation_len.labels(self.model_name).observe(generation_tokens)
        if tpot is not None:
            self.tpot.labels(self.model_name).observe(tpot)
        self.e2e.labels(self.model_name).observe(e2e)
        if finish_reasons and all(r is not None for r in finish_reasons):
            self.success.labels(self.model_name, finish_reasons[0]).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
