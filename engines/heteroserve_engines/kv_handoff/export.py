"""The exporting side: KV kept under a handle until it is pulled or expires, served as a
`protocol.kv` stream at `GET /v1/kv/{handle}` to clients that present the deployment's KV token.

The token is the per-deployment secret (a Secret in a cluster, a file locally): it is compared in
constant time and never logged. A handle is freed after one complete pull, or `timeout` seconds
after it was made (30 s by default), whichever comes first.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..protocol.kv import (
    MEDIA_TYPE,
    KvHeader,
    encode_frame,
    encode_preamble,
    encode_trailer,
)
from ..protocol.openai import ApiError

log = logging.getLogger("heteroserve.kv")

DEFAULT_TIMEOUT_SECONDS = 30.0


def load_kv_token(path: str | Path) -> bytes:
    try:
        token = Path(path).read_text().strip().encode()
    except OSError as error:
        raise ValueError(f"cannot read the KV token file {path}: {error.strerror}") from None
    if len(token) < 16:
        raise ValueError(f"the KV token in {path} is shorter than 16 characters")
    return token


@dataclass
class KeptExport:
    """One handle: what its header says, how to read a layer, how to free it."""

    header: KvHeader
    read_layer: Callable[[int], tuple[bytes, bytes]]  # may block: run in a thread
    release: Callable[[], None]
    pulling: bool = False
    timer: asyncio.TimerHandle | None = None


class KvExports:
    """The handles of one engine. Methods run on the event loop."""

    def __init__(self, token: bytes | None, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 engine_id: str | None = None):
        self.token, self.timeout = token, timeout
        self.engine_id = engine_id or secrets.token_hex(8)
        self.handles: dict[str, KeptExport] = {}

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def add(self, header: KvHeader, read_layer, release) -> str:
        handle = secrets.token_urlsafe(18)
        kept = KeptExport(header.model_copy(update={"handle": handle}), read_layer, release)
        kept.timer = asyncio.get_running_loop().call_later(self.timeout, self._expire, handle)
        self.handles[handle] = kept
        return handle

    def _expire(self, handle: str) -> None:
        kept = self.handles.get(handle)
        if kept is None or kept.pulling:
            return
        del self.handles[handle]
        kept.release()
        log.info("KV handle expired unpulled after %.0f s (%d tokens)", self.timeout,
                 kept.header.tokens)

    def _finish(self, handle: str, kept: KeptExport) -> None:
        self.handles.pop(handle, None)
        if kept.timer:
            kept.timer.cancel()
        kept.release()

    def authorize(self, header: str | None) -> None:
        scheme, _, given = (header or "").partition(" ")
        token = given.strip().encode() if scheme.lower() == "bearer" else b""
        if not self.token or not hmac.compare_digest(token, self.token):
            raise ApiError(403, "pulling KV needs this deployment's KV token",
                           code="kv_forbidden")

    def release_all(self) -> None:
        for handle, kept in list(self.handles.items()):
            self._finish(handle, kept)

    async def route(self, request: Request) -> Response:
        """GET /v1/kv/{handle}: the stream, one frame per layer as it is read."""
        if not self.enabled:
            raise ApiError(404, "this engine does not export KV (no KV token configured)",
                           code="kv_disabled")
        self.authorize(request.headers.get("authorization"))
        handle = request.path_params["handle"]
        kept = self.handles.get(handle)
        if kept is None or kept.pulling:
            raise ApiError(404, "no such KV handle (pulled already, or expired)",
                           code="kv_handle_not_found")
        kept.pulling = True

        async def body() -> AsyncIterator[bytes]:
            try:
                yield encode_preamble(kept.header)
                crcs = []
                for layer in range(kept.header.n_layer):
                    k_rows, v_rows = await run_in_threadpool(kept.read_layer, layer)
                    frame = encode_frame(layer, k_rows, v_rows)
                    crcs.append(int.from_bytes(frame[-4:], "little"))
                    yield frame
                yield encode_trailer(kept.header, crcs)
            finally:
                self._finish(handle, kept)

        return StreamingResponse(body(), media_type=MEDIA_TYPE)
