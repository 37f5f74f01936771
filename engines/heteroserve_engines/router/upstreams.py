"""The engines behind the router: discovery, health checks and load from their metrics.

Each tier's URLs are static, or (discovery `dns`) host names of headless Services re-resolved
periodically, every address being one upstream. Health checks follow sysHAX: every
`intervalSeconds`, `timeoutSeconds` each; `failureThreshold` failures in a row remove an
upstream from routing, one success re-admits it. A refused connection while proxying marks the
upstream down at once (the next check re-admits it). Load comes from each upstream's Prometheus
text under vLLM's names, scraped every `scrapeIntervalSeconds`. Each upstream's context length
(`max_model_len` in its model list, as vLLM reports it) is read when it becomes healthy, so that
the router's own model list can give the smallest of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from urllib.parse import urlsplit, urlunsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..protocol.router_config import TIERS, RouterConfig, TierConfig, TierName
from .policy import Snapshot, UpstreamState

log = logging.getLogger("heteroserve.router.upstreams")

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
# vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc (v0.10); both mean a 0-1 fraction.
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total",)
GENERATED = ("vllm:generation_tokens_total",)
# Weight of a new decode-speed sample in the moving average.
SPEED_SMOOTHING = 0.5


def read_load(text: str) -> dict[str, float]:
    """Sums of the samples of the load metrics in a Prometheus exposition (labels ignored:
    one engine serves one model)."""
    wanted = {*RUNNING, *WAITING, *KV_USAGE, *PREEMPTIONS, *GENERATED}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def _first(values: dict[str, float], names: tuple[str, ...]) -> float | None:
    return next((values[n] for n in names if n in values), None)


class Upstream:
    """One engine: its health, what the router has in flight on it, and its last load."""

    def __init__(self, url: str, tier: TierName, config: TierConfig):
        self.url, self.tier, self.config = url, tier, config
        self.healthy = False  # until the first check passes
        self.failures = 0
        self.checked = False
        self.in_flight = 0
        self.running: float | None = None
        self.waiting: float | None = None
        self.kv_usage: float | None = None
        self.preempted = False
        self.tokens_per_second: float | None = None
        self._preemptions: float | None = None
        self._generated: tuple[float, float] | None = None  # (counter, monotonic time)
        self._running: float | None = None  # at the previous scrape
        # Its context length, from its model list (None: not reported); read again whenever it
        # comes back healthy (a restarted engine may have another).
        self.max_model_len: int | None = None

    def state(self) -> UpstreamState:
        return UpstreamState(
            url=self.url, tier=self.tier, healthy=self.healthy, in_flight=self.in_flight,
            max_concurrency=self.config.max_concurrency, running=self.running,
            waiting=self.waiting, kv_usage=self.kv_usage, preempted=self.preempted,
            tokens_per_second=self.tokens_per_second, same_node=self.config.same_node)

    def record_check(self, ok: bool, threshold: int, detail: str = "") -> None:
        self.checked = True
        if ok:
            if not self.healthy:
                log.info("upstream %s (%s) is healthy", self.url, self.tier)
            self.healthy, self.failures = True, 0
            return
        self.failures += 1
        if self.healthy and self.failures >= threshold:
            self.healthy = False
            log.warning("upstream %s (%s) removed after %d failed checks: %s", self.url,
                        self.tier, self.failures, detail)

    def mark_down(self, detail: str) -> None:
        """A refused connection while proxying: out of routing until a check passes."""
        if self.healthy:
            log.warning("upstream %s (%s) marked down: %s", self.url, self.tier, detail)
        self.healthy = False

    def record_load(self, values: dict[str, float], now: float) -> None:
        self.running = _first(values, RUNNING)
        self.waiting = _first(values, WAITING)
        self.kv_usage = _first(values, KV_USAGE)
        preemptions = _first(values, PREEMPTIONS)
        self.preempted = (preemptions is not None and self._preemptions is not None
                          and preemptions > self._preemptions)
        self._preemptions = preemptions
        generated = _first(values, GENERATED)
        running, previous_running = self.running, self._running
        self._running = running
        if generated is None:
            return
        if not running:
            # Idle: no current measure (the policy counts an idle engine as fast); a speed
            # measured under yesterday's load must not keep it out of offloading.
            self.tokens_per_second = None
        elif self._generated is not None and previous_running:
            tokens, then = self._generated
            if now > then and generated >= tokens:
                # Sequences over the interval: the mean of its two ends.
                sample = (generated - tokens) / (now - then) / ((running + previous_running) / 2)
                last = self.tokens_per_second
                self.tokens_per_second = sample if last is None else (
                    SPEED_SMOOTHING * sample + (1 - SPEED_SMOOTHING) * last)
        self._generated = (generated, now)

def context_length(response: httpx.Response | None) -> int | None:
    """The smallest `max_model_len` of a model list's entries (vLLM's field; engines that do
    not report it, or an answer that is not a model list: None)."""
    if response is None or response.status_code != 200:
        return None
    try:
        data = response.json()["data"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(data, list):
        return None
    lengths = [entry.get("max_model_len") for entry in data if isinstance(entry, dict)]
    return min((n for n in lengths if type(n) is int and n > 0), default=None)


async def resolve_addresses(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


def _with_host(url: str, address: str) -> str:
    parts = urlsplit(url)
    host = f"[{address}]" if ":" in address else address
    return urlunsplit((parts.scheme, f"{host}:{_port(parts)}", "", "", ""))


def _port(parts) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


class UpstreamPool:
    """Every upstream of every tier, kept current by background tasks."""

    def __init__(self, config: RouterConfig, client: httpx.AsyncClient,
                 resolver=resolve_addresses, on_change=None):
        """`on_change(upstreams)` runs after every round of checks or scrapes (metrics)."""
        self.config, self.client, self.resolver = config, client, resolver
        self.on_change = on_change or (lambda _upstreams: None)
        self.upstreams: dict[str, Upstream] = {}
        self._tasks: list[asyncio.Task] = []
        for tier in TIERS:
            tier_config = config.tier(tier)
            if tier_config and tier_config.discovery == "static":
                for url in tier_config.urls:
                    self.upstreams[url] = Upstream(url, tier, tier_config)

    def snapshot(self) -> Snapshot:
        return Snapshot(tuple(u.state() for u in self.upstreams.values()))

    def get(self, url: str) -> Upstream | None:
        return self.upstreams.get(url)

    def tier(self, name: TierName) -> list[Upstream]:
        return [u for u in self.upstreams.values() if u.tier == name]

    async def start(self) -> None:
        """Resolves and checks every upstream once (so the first request finds the healthy
        ones), then keeps checking in the background."""
        await self.resolve_all()
        await self.check_all()
        await self.scrape_all()
        self._tasks = [asyncio.create_task(self._every(self.config.health.interval_seconds,
                                                       self.check_all), name="health"),
                       asyncio.create_task(self._every(self.config.scrape_interval_seconds,
                                                       self.scrape_all), name="scrape")]
        intervals = [t.resolve_interval_seconds for t in (self.config.accelerator,
                                                          self.config.cpu)
                     if t and t.discovery == "dns"]
        if intervals:
            self._tasks.append(asyncio.create_task(self._every(min(intervals),
                                                               self.resolve_all), name="dns"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    @staticmethod
    async def _every(seconds: float, job) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except Exception:  # a background loop must outlive any one failure
                log.exception("router background job %s failed", job.__name__)

    async def resolve_all(self) -> None:
        for tier in TIERS:
            config = self.config.tier(tier)
            if config is None or config.discovery != "dns":
                continue
            wanted: set[str] = set()
            for url in config.urls:
                parts = urlsplit(url)
                try:
                    addresses = await self.resolver(parts.hostname, _port(parts))
                except OSError as error:
                    log.warning("cannot resolve %s (%s tier): %s", parts.hostname, tier, error)
                    # Keep what was known: a DNS hiccup must not empty the tier.
                    wanted |= {u.url for u in self.tier(tier)}
                    continue
                wanted |= {_with_host(url, a) for a in addresses}
            for url in wanted - {u.url for u in self.tier(tier)}:
                log.info("discovered %s upstream %s", tier, url)
                self.upstreams[url] = Upstream(url, tier, config)
            for upstream in [u for u in self.tier(tier) if u.url not in wanted]:
                log.info("%s upstream %s is gone from DNS", tier, upstream.url)
                del self.upstreams[upstream.url]

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(u) for u in list(self.upstreams.values())))
        self.on_change(list(self.upstreams.values()))

    async def _get(self, upstream: Upstream, path: str) -> tuple[httpx.Response | None, str]:
        """(the answer, or None when the request failed; what happened, in words)."""
        try:
            response = await self.client.get(upstream.url + path,
                                             timeout=self.config.health.timeout_seconds)
        except httpx.HTTPError as error:
            return None, f"{type(error).__name__}: {error}"
        return response, f"HTTP {response.status_code}"

    async def check(self, upstream: Upstream) -> None:
        path = upstream.config.health_path or upstream.config.models_path
        response, detail = await self._get(upstream, path)
        ok = response is not None and response.status_code == 200
        if ok and not upstream.healthy:  # (re)admitted: what context does it serve?
            if path != upstream.config.models_path:
                response, _ = await self._get(upstream, upstream.config.models_path)
            upstream.max_model_len = context_length(response)
        upstream.record_check(ok, self.config.health.failure_threshold, detail)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(u) for u in list(self.upstreams.values())
                               if u.config.metrics_path and u.healthy))
        self.on_change(list(self.upstreams.values()))

    async def scrape(self, upstream: Upstream) -> None:
        response, detail = await self._get(upstream, upstream.config.metrics_path)
        if response is None or not response.is_success:
            log.debug("metrics of %s unreadable: %s", upstream.url, detail)
            return
        try:
            upstream.record_load(read_load(response.text), time.monotonic())
        except ValueError as error:  # not Prometheus text
            log.debug("metrics of %s unreadable: %s", upstream.url, error)
