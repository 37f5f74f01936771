"""Builds the router's objects from its configuration and serves them with uvicorn."""

from __future__ import annotations

import asyncio
import logging

import httpx
import uvicorn

from ..protocol.router_config import RouterConfig
from .app import create_app
from .metrics import RouterMetrics
from .service import RouterService, load_api_keys
from .transport import UpstreamTransport
from .upstreams import UpstreamPool

log = logging.getLogger("heteroserve.router")


def build_service(config: RouterConfig) -> RouterService:
    keys = load_api_keys(config.api_keys_file) if config.api_keys_file else ()
    # One client for every upstream, over a transport whose connection reuse costs the same at
    # 1 and at 256 requests in flight (transport.py); the router's admission bounds them.
    client = httpx.AsyncClient(
        transport=UpstreamTransport(),
        timeout=httpx.Timeout(config.request_timeout_seconds,
                              connect=config.connect_timeout_seconds))
    metrics = RouterMetrics()
    pool = UpstreamPool(config, client, on_change=metrics.observe_upstreams)
    return RouterService(config, client, pool, metrics, api_keys=keys)


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT the service starts draining at once (new requests 503, in-flight ones
    ended with a final chunk after drainSeconds) while uvicorn waits for connections to close."""

    def __init__(self, config: uvicorn.Config, service: RouterService):
        super().__init__(config)
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.service.begin_drain)
        super().handle_exit(sig, frame)


def serve(config: RouterConfig) -> int:
    service = build_service(config)
    app = create_app(service)
    log.info("router for %s on %s:%d, policy %s; accelerator %s; cpu %s", config.model,
             config.listen.host, config.listen.port, config.policy,
             config.accelerator.urls if config.accelerator else "-",
             config.cpu.urls if config.cpu else "-")
    server = DrainingServer(uvicorn.Config(
        app, host=config.listen.host, port=config.listen.port, log_level="warning",
        # Connections get the drain time plus a second to receive their final chunk.
        timeout_graceful_shutdown=config.drain_seconds + 1,
        # Longer than the usual 60 s idle timeout of load balancers in front: the balancer, not
        # the router, closes idle client connections (no race on a reused one).
        timeout_keep_alive=75), service)
    server.run()
    return 0
