"""The router's Prometheus metrics (a private registry with the process collectors)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
                    0.128)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56,
                   5.12, 10.24, 20.48, 40.96, 81.92)


class RouterMetrics:
    def observe_upstreams(self, upstreams) -> None:
        """Per-upstream gauges from the pool's current view (after each check and scrape)."""
        for gauge in (self.upstream_healthy, self.upstream_waiting, self.upstream_kv_usage,
                      self.upstream_speed):
            gauge.clear()
        for u in upstreams:
            self.upstream_healthy.labels(u.tier, u.url).set(1 if u.healthy else 0)
            if u.waiting is not None:
                self.upstream_waiting.labels(u.tier, u.url).set(u.waiting)
            if u.kv_usage is not None:
                self.upstream_kv_usage.labels(u.tier, u.url).set(u.kv_usage)
            if u.tokens_per_second is not None:
                self.upstream_speed.labels(u.tier, u.url).set(u.tokens_per_second)

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.requests = Counter(
            "heteroserve_router_requests", "Requests by tier, decision reason and outcome "
            "(success, upstream_error, client_disconnect, refused)",
            ["tier", "reason", "outcome"], registry=r)
        self.decisions = Counter(
            "heteroserve_router_decisions", "Routing decisions by policy, tier, mode and reason",
            ["policy", "tier", "mode", "reason"], registry=r)
        self.offloads = Counter(
            "heteroserve_router_offloads", "auto decisions that moved a request off the "
            "accelerator", ["reason"], registry=r)
        self.kv_handoffs = Counter(
            "heteroserve_router_kv_handoffs", "Split requests by outcome: ok, prefill_failed "
            "(no KV handle: the CPU computed the prompt), decode_refused (the CPU engine refused "
            "the KV: it computed the prompt)", ["outcome"], registry=r)
        self.refused = Counter(
            "heteroserve_router_refused", "Requests answered by the router itself with an error "
            "(status and code)", ["status", "code"], registry=r)
        self.upstream_errors = Counter(
            "heteroserve_router_upstream_errors", "Upstream failures (connect, timeout, status, "
            "broken stream)", ["tier", "kind"], registry=r)
        self.retries = Counter(
            "heteroserve_router_retries", "Attempts on another upstream before the first byte",
            ["tier"], registry=r)
        self.fallbacks = Counter(
            "heteroserve_router_fallbacks", "Requests served by a tier other than the decided "
            "one (its upstreams failed before the first byte)", ["from_tier", "to_tier"],
            registry=r)
        self.ttft = Histogram(
            "heteroserve_router_time_to_first_token_seconds", "Arrival to the first body byte "
            "from the upstream", ["tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram(
            "heteroserve_router_overhead_seconds", "The router's own share of the time to the "
            "first byte: from arrival to its first upstream request, plus from the upstream's "
            "first bytes to their relay", ["tier"], buckets=OVERHEAD_BUCKETS, registry=r)
        self.inter_token = Histogram(
            "heteroserve_router_inter_token_latency_seconds", "Between streamed chunks",
            ["tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(
            "heteroserve_router_e2e_request_latency_seconds", "Arrival to the last byte",
            ["tier"], buckets=LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("heteroserve_router_requests_in_flight",
                               "Requests being proxied", ["tier"], registry=r)
        self.upstream_healthy = Gauge("heteroserve_router_upstream_healthy",
                                      "1 while an upstream is in routing", ["tier", "upstream"],
                                      registry=r)
        self.upstream_waiting = Gauge("heteroserve_router_upstream_waiting",
                                      "Requests waiting in an upstream (its last scrape)",
                                      ["tier", "upstream"], registry=r)
        self.upstream_kv_usage = Gauge("heteroserve_router_upstream_kv_cache_usage",
                                       "An upstream's KV-cache usage fraction (its last scrape)",
                                       ["tier", "upstream"], registry=r)
        self.upstream_speed = Gauge("heteroserve_router_upstream_tokens_per_second",
                                    "An upstream's measured decode speed per sequence (absent "
                                    "while it is idle)", ["tier", "upstream"], registry=r)
        self.offloading = Gauge("heteroserve_router_offloading",
                                "1 while auto sends new requests to the CPU tier", registry=r)
