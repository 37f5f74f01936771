"""What both engines' HTTP servers do at their edges: a request-body limit and the SIGTERM drain.

- `Guard`, the outermost ASGI layer: a body over `max_bytes` is answered 413
  `request_too_large` (with `Connection: close`) as soon as its Content-Length, or for a chunked
  body its running size, shows it, without buffering it; and any exception the app lets through
  becomes an OpenAI-shaped 500 with `Connection: close` rather than uvicorn's plain-text one on a
  connection it then drops unannounced.
- `Drain` and `serve`: on SIGTERM/SIGINT the server stops admitting (`Drain.refuse_new`: 503
  `shutting_down` with Retry-After; uvicorn closes the listening socket), running requests may
  finish for `Drain.seconds`, then each engine ends what is left (`Drain.expired`) with a final
  chunk whose finish_reason is `abort`, and `[DONE]`.

The CPU engine (cpu_engine/server.py) and the builtin prefill engine (prefill/server.py) both use
them, with the same flags: --max-body-bytes and --drain-seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import uvicorn
from starlette.responses import JSONResponse

from .protocol.openai import ApiError

log = logging.getLogger("heteroserve.serving")

# The default --max-body-bytes: far above any prompt that fits an 8192-token context (about
# 32 KB of text), far below what ties up a core for seconds.
MAX_BODY_BYTES = 4 << 20
# The default --drain-seconds: inside Kubernetes' default terminationGracePeriodSeconds (30).
DRAIN_SECONDS = 25.0
# What an over-limit body's rest is read (and dropped) for after the 413, so that a client that
# sends it all before reading still gets the answer (nginx's lingering close, in short).
DISCARD_BYTES, DISCARD_SECONDS = 64 << 20, 5.0


@dataclass
class Drain:
    """The shutdown drain: `begin` (from the SIGTERM handler) stops admitting requests; running
    ones may finish until `seconds` later, when what is left is ended."""

    seconds: float = DRAIN_SECONDS
    deadline: float | None = None  # time.monotonic() when running requests are ended

    def begin(self) -> None:
        if self.deadline is None:
            self.deadline = time.monotonic() + self.seconds
            log.info("draining: no new requests; running ones end within %.0f s", self.seconds)

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def refuse_new(self) -> None:
        """Raises the 503 a request that arrives while draining gets."""
        if self.draining:
            raise ApiError(503, "the engine is shutting down; retry on another replica",
                           code="shutting_down", headers={"Retry-After": "1"})


def error_response(error: ApiError, close: bool = False) -> JSONResponse:
    headers = dict(error.headers)
    if close:
        headers["Connection"] = "close"
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class Guard:
    """The outermost layer (plain ASGI): the body limit and the last-resort 500 (module doc)."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than this engine's limit of "
                        f"{self.max_bytes} bytes (--max-body-bytes)", code="request_too_large")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = True
            await send(message)

        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await error_response(self.too_large(), close=True)(scope, receive, send)
            await self.discard(receive)
            return
        received, over = 0, False

        async def limited_receive():
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    over = True
                    raise self.too_large()
            return message

        try:
            await self.app(scope, limited_receive, tracked_send)
        except Exception as error:  # the last line of defence
            if started:
                raise  # mid-response: uvicorn drops the connection, the only honest end
            if isinstance(error, ApiError):  # raised outside a route (the chunked 413)
                await error_response(error, close=True)(scope, receive, send)
            else:
                log.exception("unexpected error on %s %s", scope.get("method"), scope["path"])
                await error_response(ApiError(500, f"internal error: {type(error).__name__}",
                                              code="internal_error"), close=True)(
                    scope, receive, send)
        if over:
            await self.discard(receive)

    @staticmethod
    async def discard(receive) -> None:
        """Reads and drops the rest of a refused body (bounded in bytes and time)."""
        dropped = 0

        async def drain():
            nonlocal dropped
            while dropped < DISCARD_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    return
                dropped += len(message.get("body", b""))
                if not message.get("more_body"):
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(drain(), DISCARD_SECONDS)


class DrainingServer(uvicorn.Server):
    """uvicorn, whose exit signal first starts the drain: uvicorn itself then stops accepting
    connections and waits for running requests, which the drain ends at its deadline."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig, frame) -> None:
        self.drain.begin()
        super().handle_exit(sig, frame)


def serve(app, host: str, port: int, drain: Drain) -> None:
    """Runs the server until SIGTERM/SIGINT and the drain are done."""
    # uvicorn's own grace outlasts the drain, so that ended streams can send their last chunk.
    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=drain.seconds + 5)
    DrainingServer(config, drain).run()
