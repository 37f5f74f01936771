"""Prometheus metrics under vLLM's names, so that routers read every engine alike:
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (the KV
budget's blocks in use, kept exports included), the counters `vllm:num_preemptions`,
`vllm:prompt_tokens`, `vllm:generation_tokens` and the TTFT and inter-token histograms, plus
heteroserve's finished requests by reason and open KV handles."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..kv_handoff.export import KvExports
from .engine import PrefillEngine

BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _EngineCounters(Collector):
    """The engine's running totals, read at scrape time (they can never drift from them)."""

    def __init__(self, name: str, engine: PrefillEngine):
        self.name, self.engine = name, engine

    def collect(self):
        stats = self.engine.stats
        for metric, doc, value in (
                ("vllm:prompt_tokens", "Prompt tokens computed", stats.prompt_tokens),
                ("vllm:generation_tokens", "Tokens generated", stats.generated_tokens),
                ("vllm:num_preemptions", "Sequences preempted (KV budget full; recomputed "
                 "later)", stats.preemptions)):
            family = CounterMetricFamily(metric, doc, labels=["model_name"])
            family.add_metric([self.name], value)
            yield family


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry, name: str, engine: PrefillEngine,
                 exports: KvExports):
        labels = {"model_name": name}

        def gauge(metric: str, doc: str, read) -> None:
            Gauge(metric, doc, ["model_name"], registry=registry).labels(**labels).set_function(
                read)

        gauge("vllm:num_requests_running", "Sequences being prefilled or decoded",
              lambda: len(engine.running))
        gauge("vllm:num_requests_waiting", "Requests waiting for admission",
              lambda: len(engine.waiting))
        gauge("vllm:kv_cache_usage_perc", "KV budget usage fraction (0-1)",
              lambda: engine.pool.usage)
        gauge("heteroserve:kv_handles", "KV exports kept for a pull",
              lambda: len(exports.handles))
        registry.register(_EngineCounters(name, engine))
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token",
                              ["model_name"], buckets=BUCKETS, registry=registry
                              ).labels(**labels)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens",
                             ["model_name"], buckets=BUCKETS, registry=registry).labels(**labels)
        self._requests = Counter("heteroserve:requests", "Finished requests by finish reason",
                                 ["model_name", "finish_reason"], registry=registry)
        self.name = name

    def observe(self, kind: str, seconds: float) -> None:
        (self.ttft if kind == "ttft" else self.itl).observe(seconds)

    def finished(self, reason: str) -> None:
        self._requests.labels(self.name, reason).inc()
