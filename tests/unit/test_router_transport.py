"""The router's transport (router/transport.py) against a loopback HTTP/1.1 server written
here: connections are reused, a kept-alive connection the server closed is replaced without
failing the request, and errors are httpx's."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from heteroserve_engines.router.transport import UpstreamTransport

BODY = b'{"ok":true}'


async def serve(close_after: int | None = None):
    """A server answering every request with BODY; it closes each connection after
    `close_after` requests (None: keeps it). Returns (server, port, connections opened)."""
    opened = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(writer)
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length")), 0)
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY))
                await writer.drain()
                served += 1
                if close_after is not None and served >= close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], opened


def test_sequential_requests_reuse_one_connection():
    async def scenario():
        server, port, opened = await serve()
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
            for _ in range(20):
                response = await client.post(f"http://127.0.0.1:{port}/x", content=b"{}")
                assert response.content == BODY
        server.close()
        return len(opened)

    assert asyncio.run(scenario()) == 1


def test_concurrent_requests_open_one_connection_each_and_keep_them():
    async def scenario():
        server, port, opened = await serve()
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
            for _ in range(3):
                answers = await asyncio.gather(*(client.post(f"http://127.0.0.1:{port}/x",
                                                             content=b"{}") for _ in range(8)))
                assert all(a.content == BODY for a in answers)
        server.close()
        return len(opened)

    assert asyncio.run(scenario()) == 8


@pytest.mark.parametrize("pause", [0.0, 0.01], ids=["reused-at-once", "after-the-close"])
def test_a_connection_closed_by_the_server_is_replaced_without_an_error(pause):
    async def scenario():
        server, port, opened = await serve(close_after=1)
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
            for _ in range(5):
                response = await client.post(f"http://127.0.0.1:{port}/x", content=b"{}")
                assert response.content == BODY
                await asyncio.sleep(pause)  # 0: reused as the server closes it
        server.close()
        return len(opened)

    assert asyncio.run(scenario()) == 5


def test_errors_are_httpx_errors():
    async def scenario():
        server, port, _ = await serve()
        server.close()
        await server.wait_closed()
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
            await client.get(f"http://127.0.0.1:{port}/x")

    with pytest.raises(httpx.ConnectError):
        asyncio.run(scenario())


async def serve_raw(answer: bytes, then_wait: float = 0.0):
    """A server that answers every request with the raw bytes `answer`, then waits and closes."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(then_wait)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_chunked_stream_arrives_piece_by_piece():
    chunked = (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")

    async def scenario():
        server, port = await serve_raw(chunked)
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client, \
                client.stream("GET", f"http://127.0.0.1:{port}/") as response:
            pieces = [piece async for piece in response.aiter_raw()]
        server.close()
        return pieces

    assert b"".join(asyncio.run(scenario())) == b"hello world"


@pytest.mark.parametrize(("answer", "wait", "error"), [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 0.0, httpx.RemoteProtocolError),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 5.0, httpx.ReadTimeout),
    (b"", 0.0, httpx.RemoteProtocolError),
    (b"NOT HTTP AT ALL\r\n\r\n", 0.0, httpx.RemoteProtocolError),
], ids=["closed-mid-body", "silent-mid-body", "closed-before-answering", "not-http"])
def test_upstream_failures_are_httpx_errors(answer, wait, error):
    async def scenario():
        server, port = await serve_raw(answer, wait)
        try:
            async with httpx.AsyncClient(transport=UpstreamTransport(),
                                         timeout=httpx.Timeout(0.5)) as client:
                await client.get(f"http://127.0.0.1:{port}/")
        finally:
            server.close()

    with pytest.raises(error):
        asyncio.run(scenario())


@pytest.mark.parametrize("reused", [False, True], ids=["new-connection", "kept-alive"])
def test_a_cancelled_request_closes_its_connection(reused):
    """A client that leaves cancels the router's upstream request: the upstream must see its
    connection closed (that is what stops an engine decoding for nobody)."""
    async def scenario():
        closed = asyncio.Event()
        answered = 0

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal answered
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length")), 0)
                    await reader.readexactly(length)
                    if answered < int(reused):  # the first request is answered, the next not
                        answered += 1
                        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                closed.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client:
            if reused:
                assert (await client.post(f"http://127.0.0.1:{port}/", content=b"{}")).content \
                    == b"ok"
            task = asyncio.create_task(client.post(f"http://127.0.0.1:{port}/", content=b"{}"))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(closed.wait(), 2)
        server.close()

    asyncio.run(scenario())


def test_a_long_stream_read_slowly_arrives_whole():
    """Backpressure: while the reader is slow the connection stops reading the socket (pieces
    beyond lean.HIGH_WATER pause it) and resumes; no byte is lost or reordered."""
    pieces = [b"%06d" % i for i in range(50000)]
    body = b"".join(b"6\r\n" + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"
    answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body

    async def scenario():
        server, port = await serve_raw(answer, 1.0)
        async with httpx.AsyncClient(transport=UpstreamTransport()) as client, \
                client.stream("GET", f"http://127.0.0.1:{port}/") as response:
            got = []
            async for piece in response.aiter_raw():
                got.append(piece)
                if len(got) % 2000 == 0:
                    await asyncio.sleep(0.01)
        server.close()
        return b"".join(got)

    assert asyncio.run(scenario()) == b"".join(pieces)
