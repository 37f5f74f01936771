"""Plain-HTTP/1.1 connections to upstreams with httptools' C parser: what the router's transport
uses for `http://` upstreams (the cluster's and the local ones); `https://` goes through httpcore.

The router spends its CPU per request and per relayed chunk. httpcore writes a request in two
socket sends through anyio and parses responses with h11 in pure Python; here a request is one
write and the response is parsed by httptools (the parser uvicorn uses). Errors are httpx's own
exception types, so the router cannot tell the two paths apart.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable

import httptools
import httpx

READ_SIZE = 65536


class _Parse:
    """httptools callbacks: the status line and headers, then body pieces as they come."""

    def __init__(self):
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: deque[bytes] = deque()
        self.complete = False
        self.keep_alive = False
        self.parser = None  # set once the parser exists

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


class LeanConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.closed = False
        self.requests = 0

    @classmethod
    async def open(cls, host: str, port: int, timeout: float | None) -> LeanConnection:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as error:
            raise httpx.ConnectError(f"{host}:{port}: {error}") from None
        return cls(reader, writer)

    def usable(self) -> bool:
        """Idle and not closed by the peer (an idle connection has nothing to read)."""
        return (not self.closed and not self.writer.is_closing()
                and not self.reader.at_eof() and not self.reader._buffer)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.writer.close()

    async def read(self, timeout: float | None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self.reader.read(READ_SIZE)
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout("the upstream sent nothing in time") from None
        except OSError as error:
            self.close()
            raise httpx.ReadError(str(error)) from None

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
        try:
            self.writer.write(b"".join(head) + body)
        except OSError as error:
            self.close()
            raise httpx.WriteError(str(error)) from None
        parse = _Parse()
        parser = parse.parser = httptools.HttpResponseParser(parse)
        received = False
        while not parse.headers_done:
            data = await self.read(timeouts.get("read"))
            if not data:
                self.close()
                raise httpx.RemoteProtocolError(
                    "the upstream closed the connection without answering"
                    if not received else "the upstream closed the connection mid-headers")
            received = True
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as error:
                self.close()
                raise httpx.RemoteProtocolError(f"invalid HTTP from the upstream: {error}"
                                                ) from None
        stream = _Body(self, parser, parse, timeouts.get("read"), on_done)
        return httpx.Response(parser.get_status_code(), headers=parse.headers, stream=stream,
                              extensions={"http_version": b"HTTP/1.1"})


class _Body(httpx.AsyncByteStream):
    def __init__(self, connection: LeanConnection, parser, parse: _Parse,
                 timeout: float | None, on_done: Callable[[], None]):
        self.connection, self.parser, self.parse = connection, parser, parse
        self.timeout, self.on_done = timeout, on_done
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        parse = self.parse
        while True:
            while parse.body:
                yield parse.body.popleft()
            if parse.complete:
                return
            data = await self.connection.read(self.timeout)
            if not data:
                self.connection.close()
                raise httpx.RemoteProtocolError("the upstream closed the connection mid-body")
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as error:
                self.connection.close()
                raise httpx.RemoteProtocolError(f"invalid HTTP body: {error}") from None

    async def aclose(self) -> None:
        if self.finished:
            return
        self.finished = True
        if not (self.parse.complete and self.parse.keep_alive):
            self.connection.close()  # unread body or no keep-alive: it cannot carry another
        self.on_done()
