"""Plain-HTTP/1.1 connections to upstreams with httptools' C parser: what the router's transport
uses for `http://` upstreams (the cluster's and the local ones); `https://` goes through httpcore.

The router spends its CPU per request and per relayed chunk. httpcore writes a request in two
socket sends through anyio and parses responses with h11 in pure Python; here a request is one
write, and the connection is an asyncio Protocol whose `data_received` feeds httptools directly
(no StreamReader buffer in between). The read timeout is one timer per response that re-arms
itself from the time of the last data, not a timeout context per read: a relayed token costs a
deque append and one future (a timeout context per read was a tenth of the router's CPU in a
py-spy profile of a stream of spaced tokens). Errors are httpx's own exception types, so the
router cannot tell the two paths apart.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

import httptools
import httpx

# Body pieces buffered before the socket stops being read (backpressure); reading resumes once
# the relay has taken them down to LOW_WATER.
HIGH_WATER, LOW_WATER = 64, 16


class _Response:
    """httptools callbacks for one response: the status line and headers, then body pieces."""

    def __init__(self):
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: deque[bytes] = deque()
        self.complete = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # Asked here: once the message is complete the parser no longer says.
        self.keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class LeanConnection(asyncio.Protocol):
    def __init__(self):
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.eof = False  # the upstream closed its side
        self.error: Exception | None = None  # a parse error, raised to the reader
        self.response: _Response | None = None  # the one being received
        self.waiter: asyncio.Future | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last_data = self.wait_since = 0.0
        self.paused = False
        self.requests = 0

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        response = self.response
        if response is None or self.error is not None:
            # Bytes nobody asked for (after a complete response): the connection cannot be
            # trusted with another request.
            self.close()
            return
        try:
            response.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.error = httpx.RemoteProtocolError(f"invalid HTTP from the upstream: {error}")
        if len(response.body) > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- the transport's side --------------------------------------------------------------------
    @classmethod
    async def open(cls, host: str, port: int, timeout: float | None) -> LeanConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(cls, host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as error:
            raise httpx.ConnectError(f"{host}:{port}: {error}") from None
        return connection

    def usable(self) -> bool:
        """Idle and not closed by the peer (an idle connection has nothing to read)."""
        return not (self.closed or self.eof or self.transport.is_closing())

    def close(self) -> None:
        self._disarm()
        if not self.closed:
            self.closed = True
            self.transport.close()
            self._wake()

    def taken(self, response: _Response) -> None:
        """The relay took body pieces: resume reading once few are left."""
        if self.paused and len(response.body) <= LOW_WATER and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    async def wait(self) -> None:
        """Until data, EOF or an error arrives (httpx.ReadTimeout: see `_arm`)."""
        self.wait_since = self.loop.time()
        waiter = self.waiter = self.loop.create_future()
        try:
            await waiter
        except httpx.ReadTimeout:
            self.close()
            raise
        finally:
            self.waiter = None

    def _arm(self, response: _Response, timeout: float | None) -> None:
        """One timer per response: a wait with no data for `timeout` seconds (from the last
        data or the start of the wait, whichever is later) fails with httpx.ReadTimeout. It
        re-arms itself from those times, so a steady stream costs no timer operations."""
        if timeout is None:
            return

        def check() -> None:
            if self.response is not response or self.closed:
                return
            waiter = self.waiter
            if waiter is None or waiter.done():
                self.timer = self.loop.call_later(timeout, check)
                return
            left = max(self.last_data, self.wait_since) + timeout - self.loop.time()
            if left > 0:
                self.timer = self.loop.call_later(left, check)
            else:
                waiter.set_exception(httpx.ReadTimeout("the upstream sent nothing in time"))
        self.timer = self.loop.call_later(timeout, check)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    async def send(self, request: httpx.Request, timeouts: dict, on_done: Callable[[], None]
                   ) -> httpx.Response:
        """Sends `request`; returns once the response headers are in. The body streams."""
        self.requests += 1
        body = b"".join([part async for part in request.stream])
        head = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            if name.lower() not in (b"content-length", b"transfer-encoding"):
                head += [name, b": ", value, b"\r\n"]
        head += [b"content-length: ", str(len(body)).encode(), b"\r\n\r\n"]
        response = self.response = _Response()
        self.last_data = self.loop.time()
        if self.closed or self.transport.is_closing():
            raise httpx.WriteError("the upstream connection is closed")
        self.transport.write(b"".join(head) + body)
        self._arm(response, timeouts.get("read"))
        while not response.headers_done:
            if self.error is not None:
                self.close()
                raise self.error
            if self.eof:
                self.close()
                raise httpx.RemoteProtocolError(
                    "the upstream closed the connection mid-headers" if response.headers
                    else "the upstream closed the connection without answering")
            await self.wait()
        stream = _Body(self, response, on_done)
        return httpx.Response(response.parser.get_status_code(), headers=response.headers,
                              stream=stream, extensions={"http_version": b"HTTP/1.1"})


class _Body(httpx.AsyncByteStream):
    def __init__(self, connection: LeanConnection, response: _Response,
                 on_done: Callable[[], None]):
        self.connection, self.response, self.on_done = connection, response, on_done
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection, response = self.connection, self.response
        body = response.body
        while True:
            while body:
                piece = body.popleft()
                connection.taken(response)
                yield piece
            if response.complete:
                return
            if connection.error is not None:
                connection.close()
                raise connection.error
            if connection.eof or connection.closed:
                connection.close()
                raise httpx.RemoteProtocolError("the upstream closed the connection mid-body")
            await connection.wait()

    async def aclose(self) -> None:
        if self.finished:
            return
        self.finished = True
        connection, response = self.connection, self.response
        connection._disarm()
        if response.complete and response.keep_alive and not connection.error:
            connection.response = None  # idle: ready for the next request
        else:
            connection.close()  # unread body or no keep-alive: it cannot carry another
        self.on_done()
