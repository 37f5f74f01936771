"""The streaming pass-through: bytes from one upstream response to the client, chunk by chunk.

A pump task reads the upstream body into a small bounded queue (backpressure: a slow client slows
the upstream read, nothing accumulates); the response body iterates the queue. The pump lets the
router end a relay from outside (drain on shutdown, the request deadline) without cancelling the
client's task: an ended or broken event stream gets an SSE error event and `[DONE]`, never a hung
connection. Only bytes are moved: the stream is never parsed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx

from ..protocol.openai import SSE_DONE, ApiError, sse_error

QUEUE_CHUNKS = 64
_END = object()


class Relay:
    """One upstream response relayed to one client. `outcome` ends as "success",
    "upstream_error" (the upstream broke or went silent mid-body), "aborted" (ended by the
    router) or "client_disconnect". A client that goes away once it has the whole response
    (an event stream's `[DONE]`, or a body's Content-Length) before the upstream's end of body
    reaches the router is a success: it had everything."""

    def __init__(self, response: httpx.Response, *, event_stream: bool,
                 on_chunk: Callable[[float], None], on_end: Callable[[Relay], None]):
        self.response, self.event_stream = response, event_stream
        self.on_chunk, self.on_end = on_chunk, on_end
        self.queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)
        self.outcome = "client_disconnect"
        self.error: ApiError | None = None
        self.error_detail = ""
        self._aborted = False
        self._sent = 0  # bytes the server took from this relay (asked for the next chunk)
        self._done_sent = False  # an event stream's [DONE] among them
        self._pump: asyncio.Task | None = None
        self.first_received: float | None = None  # when the upstream's first bytes came

    def abort(self, error: ApiError) -> None:
        """Ends the relay from outside at once: the client gets `error` as a final event."""
        if self.error is None or not self._aborted:
            self.error, self.outcome, self._aborted = error, "aborted", True
        if self._pump:
            self._pump.cancel()
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(_END)  # wakes a waiting consumer; a busy one sees _aborted

    async def _read(self) -> None:
        try:
            async for chunk in self.response.aiter_raw():
                if self.first_received is None:
                    self.first_received = time.monotonic()
                await self.queue.put(chunk)
        except Exception as error:  # any failure ends the stream the same way
            if self.error is None:
                late = isinstance(error, httpx.TimeoutException)
                self.error_detail = f"{type(error).__name__}: {error}"
                self.error = ApiError(502, f"the upstream engine's stream "
                                      f"{'timed out' if late else 'broke'} after the first "
                                      "byte", code="upstream_stream_error")
                self.outcome = "upstream_error"
        # After what was already queued (the client gets every byte that came before an error);
        # not on cancellation: abort() has already woken the consumer.
        await self.queue.put(_END)

    def _complete(self) -> bool:
        if self.event_stream:
            return self._done_sent
        length = self.response.headers.get("content-length", "")
        return length.isdigit() and self._sent >= int(length)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self._pump = asyncio.create_task(self._read())
        try:
            while True:
                item = await self.queue.get()
                if self._aborted or item is _END:
                    if self.error is not None:
                        if self.event_stream:
                            yield sse_error(self.error)
                            yield SSE_DONE
                    else:
                        self.outcome = "success"
                    return
                self.on_chunk(time.monotonic())
                yield item
                # the server asks for more: the chunk went out
                self._sent += len(item)
                self._done_sent = self._done_sent or (
                    self.event_stream and item.rstrip().endswith(SSE_DONE.rstrip()))
        finally:
            if self.outcome == "client_disconnect" and self._complete():
                self.outcome = "success"
            # Shielded: a client disconnect arrives as the cancellation of this task's scope
            # (level-triggered in anyio), which would cancel the close itself and leave the
            # upstream connection open, its engine decoding for nobody.
            with anyio.CancelScope(shield=True):
                self._pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._pump
                await self.response.aclose()
            self.on_end(self)
