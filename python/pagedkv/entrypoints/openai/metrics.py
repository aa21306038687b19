"""Prometheus metrics of one server, named like vLLM's, under both prefixes: ``pagedkv:`` and
``vllm:`` (every series twice), so that vLLM's dashboards and alerts work unchanged.

Gauges and counters are read from the engine's stats snapshot at scrape time (a custom
collector, so values never drift from the engine's own counters); latency histograms are
observed by the request handlers, ``iteration_tokens_total`` by the engine loop after each
step. Each app has its own CollectorRegistry so several servers (or tests) in one process do
not collide.

Everything observed here is per HTTP request, as in vLLM: a request with ``n`` choices (or a
batch of prompts) is one observation of each latency histogram and, if it finished, one
``request_success`` count. Its ``finished_reason`` label is that of the response's first choice
(index 0); a request with any choice unfinished (the client went away, the engine failed) is
not a success and is not counted. The phase histograms (queue, prefill, decode, inference) use
the engine's milestones of the request's first prompt; ``inter_token_latency_seconds`` is
observed per streamed chunk, and once (the mean) for a request answered whole.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Every metric is exported under each prefix: pagedkv's own, and vLLM's for its dashboards.
PREFIXES = ("pagedkv:", "vllm:")

# (engine stats key, metric name without prefix, kind, help)
_ENGINE_METRICS = (
    (
        "num_requests_running",
        "num_requests_running",
        "gauge",
        "Number of requests in the running batch.",
    ),
    (
        "num_requests_waiting",
        "num_requests_waiting",
        "gauge",
        "Number of requests waiting to be scheduled.",
    ),
    (
        "kv_cache_usage_perc",
        "kv_cache_usage_perc",
        "gauge",
        "Fraction of KV-cache blocks in use (1 = full).",
    ),
    # vLLM V0's name of the same gauge, which older dashboards and alerts still read.
    (
        "kv_cache_usage_perc",
        "gpu_cache_usage_perc",
        "gauge",
        "Fraction of KV-cache blocks in use (1 = full); vLLM V0's name of kv_cache_usage_perc.",
    ),
    (
        "prefix_cache_queries",
        "prefix_cache_queries",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
    ),
    (
        "prefix_cache_hits",
        "prefix_cache_hits",
        "counter",
        "Prompt tokens found in the prefix cache.",
    ),
    (
        "num_preemptions",
        "num_preemptions",
        "counter",
        "Requests preempted (recomputed later) for lack of KV blocks.",
    ),
    ("prompt_tokens", "prompt_tokens", "counter", "Prefill tokens processed."),
    (
        "spec_decode_num_drafts",
        "spec_decode_num_drafts",
        "counter",
        "Speculative decoding: sequence steps that fed draft tokens.",
    ),
    (
        "spec_decode_num_draft_tokens",
        "spec_decode_num_draft_tokens",
        "counter",
        "Speculative decoding: draft tokens fed to the target model.",
    ),
    (
        "spec_decode_num_accepted_tokens",
        "spec_decode_num_accepted_tokens",
        "counter",
        "Speculative decoding: draft tokens accepted.",
    ),
    ("generation_tokens", "generation_tokens", "counter", "Tokens generated."),
)

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
_TPOT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)


class _EngineCollector(Collector):
    def __init__(self, engine: Any, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterable[Metric]:
        stats = self.engine.get_stats()
        for prefix in PREFIXES:
            for key, name, kind, doc in _ENGINE_METRICS:
                family_cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
                family = family_cls(prefix + name, doc, labels=["model_name"])
                family.add_metric([self.model_name], float(stats.get(key, 0) or 0))
                yield family
            dead = GaugeMetricFamily(
                prefix + "engine_dead", "1 once the engine loop has died.", labels=["model_name"]
            )
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


_PHASE_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class _Twins:
    """One histogram or counter under every prefix; observations go to all of them."""

    def __init__(
        self, kind: Any, name: str, doc: str, labels: List[str], registry: Any, **kw: Any
    ) -> None:
        self.metrics = [
            kind(prefix + name, doc, labels, registry=registry, **kw) for prefix in PREFIXES
        ]

    def labels(self, *values: str) -> _Twins:
        twin = object.__new__(_Twins)
        twin.metrics = [m.labels(*values) for m in self.metrics]
        return twin

    def observe(self, value: float) -> None:
        for m in self.metrics:
            m.observe(value)

    def inc(self, amount: float = 1.0) -> None:
        for m in self.metrics:
            m.inc(amount)


class ServerMetrics:
    def __init__(self, engine: Any, model_name: str, max_model_len: int = 8192) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> _Twins:
            return _Twins(Histogram, name, doc, labels, self.registry, buckets=buckets)

        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            _LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "time_per_output_token_seconds",
            "Mean time between output tokens of a request.",
            _TPOT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds", "Time between successive output tokens.", _TPOT_BUCKETS
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            _LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "request_queue_time_seconds",
            "Time a request waited before its first scheduling.",
            _PHASE_BUCKETS,
        )
        self.prefill = histogram(
            "request_prefill_time_seconds",
            "Time from a request's first scheduling to its first token.",
            _PHASE_BUCKETS,
        )
        self.decode = histogram(
            "request_decode_time_seconds",
            "Time from a request's first token to its last.",
            _PHASE_BUCKETS,
        )
        self.inference = histogram(
            "request_inference_time_seconds",
            "Time from a request's first scheduling to its last token.",
            _PHASE_BUCKETS,
        )
        # Token counts per request (vLLM's names), for its dashboards' length panels.
        lengths = _one_two_five(max_model_len)
        self.prompt_len = histogram("request_prompt_tokens", "Prompt tokens of a request.", lengths)
        self.generation_len = histogram(
            "request_generation_tokens",
            "Tokens generated for a request (all its choices).",
            lengths,
        )
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Tokens (prompt and generated) of one engine step.",
            _one_two_five(max(max_model_len, 16384)),
        )
        self.success = _Twins(
            Counter,
            "request_success",
            "Finished requests, by the finish reason of their first choice.",
            labels + ["finished_reason"],
            self.registry,
        )
        # Exported from the start with zero counts, as vLLM's are: a scrape before the first
        # request sees every series (dashboards show 0, not "no data").
        for h in (
            self.ttft,
            self.tpot,
            self.itl,
            self.e2e,
            self.queue,
            self.prefill,
            self.decode,
            self.inference,
            self.prompt_len,
            self.generation_len,
            self.iteration_tokens,
        ):
            h.labels(model_name)
        for reason in ("stop", "length"):
            self.success.labels(model_name, reason)
        add_observer = getattr(engine, "add_step_observer", None)
        if add_observer is not None:
            add_observer(self.observe_step)

    def observe_step(self, num_tokens: int) -> None:
        """One engine step that processed ``num_tokens`` tokens (the engine thread calls it)."""
        if num_tokens > 0:
            self.iteration_tokens.labels(self.model_name).observe(num_tokens)

    def observe_request(
        self,
        ttft: float,
        tpot: Optional[float],
        e2e: float,
        finish_reasons: Sequence[Optional[str]],
        prompt_tokens: int = 0,
        generation_tokens: int = 0,
        engine_metrics: Any = None,
    ) -> None:
        """One HTTP request; ``finish_reasons`` of its choices by index (None: unfinished);
        ``engine_metrics``: the RequestMetrics of its (first) prompt, for the phase times."""
        name = self.model_name
        self.ttft.labels(name).observe(ttft)
        self.prompt_len.labels(name).observe(prompt_tokens)
        self.generation_len.labels(name).observe(generation_tokens)
        if tpot is not None:
            self.tpot.labels(name).observe(tpot)
        self.e2e.labels(name).observe(e2e)
        self._observe_phases(engine_metrics)
        if finish_reasons and all(r is not None for r in finish_reasons):
            self.success.labels(name, str(finish_reasons[0])).inc()

    def observe_token_interval(self, seconds: float) -> None:
        self.itl.labels(self.model_name).observe(seconds)

    def _observe_phases(self, m: Any) -> None:
        if m is None or m.first_scheduled_time is None:
            return
        name = self.model_name
        self.queue.labels(name).observe(max(0.0, m.first_scheduled_time - m.arrival_time))
        if m.first_token_time is None:
            return
        self.prefill.labels(name).observe(max(0.0, m.first_token_time - m.first_scheduled_time))
        last = m.last_token_time or m.first_token_time
        self.decode.labels(name).observe(max(0.0, last - m.first_token_time))
        self.inference.labels(name).observe(max(0.0, last - m.first_scheduled_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)
