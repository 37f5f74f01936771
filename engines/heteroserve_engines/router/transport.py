"""The router's httpx transport: keep-alive HTTP/1.1 connections to the upstreams, taken and
given back in constant time. Plain `http://` upstreams go through `lean.py` (one write per
request, httptools' parser); `https://` ones through httpcore's connections.

httpx's default pool (httpcore's AsyncConnectionPool) re-examines every connection, and asks each
whether it has expired, on every request and every response close: with 64 requests in flight
that scan was a large share of the router's CPU in a py-spy profile (canned upstream, 2-token
answers). Here each
origin keeps a stack of idle connections; a request pops one (checking only that one), a closed
response pushes it back if it can carry another request. Connections are httpcore's own, so
HTTP parsing, timeouts (from the request's extensions) and errors are httpx's as usual. The
router's admission limits, not the transport, bound the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpcore
import httpx

# httpx's own mapping of httpcore's exceptions to its public ones (as its default transport
# does), so the router sees httpx.ConnectError, ReadTimeout, ... whichever transport runs.
from httpx._transports.default import map_httpcore_exceptions

from .lean import LeanConnection

DEFAULT_PORTS = {b"http": 80, b"https": 443}
STALE_CONNECTION_ERRORS = (httpcore.ConnectionNotAvailable, httpcore.RemoteProtocolError,
                           httpcore.ReadError, httpcore.WriteError)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream, on_close):
        self._stream, self._on_close = stream, on_close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with map_httpcore_exceptions():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        try:
            with map_httpcore_exceptions():
                await self._stream.aclose()
        finally:
            self._on_close()


class UpstreamTransport(httpx.AsyncBaseTransport):
    def __init__(self, keepalive_expiry: float = 5.0, max_idle_per_origin: int = 512):
        self.keepalive_expiry, self.max_idle = keepalive_expiry, max_idle_per_origin
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTPConnection]] = {}
        self._lean_idle: dict[tuple[str, int], list[LeanConnection]] = {}
        self._closing: set[asyncio.Task] = set()

    async def _lean_request(self, request: httpx.Request) -> httpx.Response:
        """Plain http: one write per request, httptools parsing (lean.py)."""
        url = request.url
        key = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        idle = self._lean_idle.setdefault(key, [])
        while idle:
            connection = idle.pop()
            if connection.usable():
                try:
                    return await connection.send(request, timeouts,
                                                 lambda c=connection: self._lean_back(key, c))
                except (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError):
                    connection.close()  # closed by the upstream as it was reused: a new one
                except BaseException:
                    # Cancelled (the client left) or failed mid-request: closing the
                    # connection is what tells the engine to stop.
                    connection.close()
                    raise
            else:
                connection.close()
        connection = await LeanConnection.open(key[0], key[1], timeouts.get("connect"))
        try:
            return await connection.send(request, timeouts,
                                         lambda: self._lean_back(key, connection))
        except BaseException:
            connection.close()
            raise

    def _lean_back(self, key: tuple[str, int], connection: LeanConnection) -> None:
        idle = self._lean_idle.setdefault(key, [])
        if not connection.closed and len(idle) < self.max_idle:
            idle.append(connection)
        else:
            connection.close()

    def _close_later(self, connection: httpcore.AsyncHTTPConnection) -> None:
        task = asyncio.ensure_future(connection.aclose())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _take(self, key: tuple[bytes, bytes, int], origin: httpcore.Origin
              ) -> tuple[httpcore.AsyncHTTPConnection, bool]:
        """A connection, and whether it was reused."""
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.is_idle() and not connection.has_expired():
                return connection, True
            self._close_later(connection)
        return httpcore.AsyncHTTPConnection(origin=origin,
                                            keepalive_expiry=self.keepalive_expiry), False

    def _give_back(self, key: tuple[bytes, bytes, int],
                   connection: httpcore.AsyncHTTPConnection) -> None:
        idle = self._idle.setdefault(key, [])
        if connection.is_idle() and len(idle) < self.max_idle:
            idle.append(connection)
        elif not connection.is_closed():
            self._close_later(connection)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme == "http":
            return await self._lean_request(request)
        port = url.port or DEFAULT_PORTS.get(url.raw_scheme, 80)
        key = (url.raw_scheme, url.raw_host, port)
        origin = httpcore.Origin(url.raw_scheme, url.raw_host, port)
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw, content=request.stream,
            extensions=request.extensions)
        connection, reused = self._take(key, origin)
        try:
            with map_httpcore_exceptions():
                try:
                    response = await connection.handle_async_request(core_request)
                except STALE_CONNECTION_ERRORS:
                    if not reused:
                        raise
                    # The upstream closed the kept-alive connection as it was reused: nothing
                    # was answered, so the request goes once more on a new connection.
                    self._close_later(connection)
                    connection, _ = self._take(key, origin)
                    response = await connection.handle_async_request(core_request)
        except BaseException:
            self._close_later(connection)
            raise
        return httpx.Response(
            status_code=response.status, headers=response.headers,
            stream=_ResponseStream(response.stream, lambda: self._give_back(key, connection)),
            extensions=response.extensions)

    async def aclose(self) -> None:
        for lean in self._lean_idle.values():
            for connection in lean:
                connection.close()
        self._lean_idle.clear()
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(Exception):
                    await connection.aclose()
        self._idle.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
