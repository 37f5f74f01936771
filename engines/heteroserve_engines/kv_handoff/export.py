"""The exporting side: KV kept under a handle until it is pulled or expires, served as a
`protocol.kv` stream at `GET /v1/kv/{handle}` to clients that present the deployment's KV token.

The token is the per-deployment secret (a Secret in a cluster, a file locally): it is compared in
constant time and never logged. A handle is freed after one complete pull, or `timeout` seconds
after it was made (30 s by default), whichever comes first.

Shared memory (sysHAX's placement: prefill and decode on one node): with a `shm_dir` (a
memory-backed directory that the decode engine mounts too) the exporter writes a marker file
`exporter-<engine id>` there at start; a decode engine that sees the marker in its own directory
knows they share it and pulls with `?transport=shm`. The exporter then writes the same version-1
stream into a new file of that directory (mode 0600, an unguessable name) and answers its name
instead of the bytes; the decoder maps it, verifies it and unlinks it. A file nobody unlinked is
removed `timeout` seconds later.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hmac
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..protocol.kv import (
    MEDIA_TYPE,
    KvHeader,
    encode_frame_head,
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


def shm_directory(path: str | None) -> Path | None:
    """`--kv-shm-dir`, checked: an existing directory this process can write. ValueError."""
    if not path:
        return None
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"--kv-shm-dir {path}: no such directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--kv-shm-dir {path}: not writable by this user")
    return folder


def shm_marker(shm_dir: Path, engine_id: str) -> Path:
    """The file whose presence tells a decoder that it shares `shm_dir` with this exporter."""
    return shm_dir / f"exporter-{engine_id}"


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
                 engine_id: str | None = None, shm_dir: str | Path | None = None,
                 advertise_host: str | None = None):
        self.token, self.timeout = token, timeout
        # The address decode engines pull from (`remote_host`): this pod's IP in a cluster,
        # where the router may reach this engine on loopback (its sidecar). None: the router
        # fills in the address it used.
        self.advertise_host = advertise_host or None
        self.engine_id = engine_id or secrets.token_hex(8)
        self.handles: dict[str, KeptExport] = {}
        self.shm_dir = Path(shm_dir) if shm_dir else None
        if self.shm_dir:
            marker = shm_marker(self.shm_dir, self.engine_id)
            marker.write_text(str(os.getpid()))
            # A marker left by a killed process is harmless: no exporter has its id again.
            atexit.register(marker.unlink, missing_ok=True)

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
        if self.shm_dir:
            shm_marker(self.shm_dir, self.engine_id).unlink(missing_ok=True)

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
        if request.query_params.get("transport") == "shm":
            return await self._write_shm(handle, kept)

        async def body() -> AsyncIterator[bytes]:
            try:
                yield encode_preamble(kept.header)
                crcs = []
                for layer in range(kept.header.n_layer):
                    k_rows, v_rows = await run_in_threadpool(kept.read_layer, layer)
                    head, crc = encode_frame_head(layer, k_rows, v_rows)
                    crcs.append(crc)
                    # Piece by piece: joining the rows into one frame would copy them.
                    yield head
                    yield k_rows
                    yield v_rows
                    yield crc.to_bytes(4, "little")
                yield encode_trailer(kept.header, crcs)
            finally:
                self._finish(handle, kept)

        return StreamingResponse(body(), media_type=MEDIA_TYPE)

    async def _write_shm(self, handle: str, kept: KeptExport) -> Response:
        """The stream into a new file of the shared directory; answers its name and size."""
        if self.shm_dir is None:
            kept.pulling = False
            raise ApiError(400, "this engine has no shared-memory directory (--kv-shm-dir)",
                           code="kv_shm_unavailable")
        name = f"kv-{secrets.token_urlsafe(18)}"
        path = self.shm_dir / name
        try:
            size = await run_in_threadpool(_write_stream, path, kept)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            self._finish(handle, kept)
        # The decoder unlinks it once mapped; this is for a decoder that died first.
        asyncio.get_running_loop().call_later(self.timeout, _unlink_quietly, path)
        return JSONResponse({"file": name, "bytes": size})


def _write_stream(path: Path, kept: KeptExport) -> int:
    """Writes the version-1 stream of `kept` into `path` (created, 0600); its size."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        size = os.write(fd, encode_preamble(kept.header))
        crcs = []
        for layer in range(kept.header.n_layer):
            k_rows, v_rows = kept.read_layer(layer)
            head, crc = encode_frame_head(layer, k_rows, v_rows)
            crcs.append(crc)
            # Written piece by piece: the rows are not joined into one frame first.
            for piece in (head, k_rows, v_rows, crc.to_bytes(4, "little")):
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view):]
            size += len(head) + len(k_rows) + len(v_rows) + 4
        size += os.write(fd, encode_trailer(kept.header, crcs))
    finally:
        os.close(fd)
    return size


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
