"""The importing side: pull a handle's stream from the exporting engine and verify it, over TCP
or, where both engines share a memory-backed directory, through a file in it (export.py)."""

from __future__ import annotations

import asyncio
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..protocol.kv import KvHeader, KvProtocolError, KvStreamReader, KvTransferParams
from .export import shm_marker

# What an exporter may name a file in the shared directory (never a path).
SHM_FILE = re.compile(r"kv-[A-Za-z0-9_-]{16,64}")


class KvPullError(Exception):
    """The KV could not be pulled or verified; `code` names why (for the error answered)."""

    def __init__(self, code: str, message: str, transport: str = "tcp"):
        super().__init__(message)
        self.code, self.message, self.transport = code, message, transport


@dataclass
class PulledKv:
    header: KvHeader
    layers: list[tuple[bytes | memoryview, bytes | memoryview]]
    wire_bytes: int
    transport: str  # "tcp" or "shm"


async def pull_kv(client: httpx.AsyncClient, params: KvTransferParams, token: bytes,
                  fingerprint: str, prompt_ids: list[int], rope: str, n_layer: int,
                  n_head_kv: int, head_dim: int, timeout: float = 60,
                  shm_dir: Path | None = None) -> PulledKv:
    """Fetches `params.remote_handle` from `params.remote_host:remote_port` and checks it
    against this engine's model (fingerprint, RoPE, shapes) and the request's prompt (the KV's
    tokens must be its prefix). Through shared memory when the exporter's marker is in
    `shm_dir`, else over TCP. Raises KvPullError."""
    if not (params.remote_host and params.remote_port and params.remote_handle):
        raise KvPullError("kv_params_invalid", "kv_transfer_params with do_remote_prefill need "
                          "remote_host, remote_port and remote_handle")
    url = f"http://{params.remote_host}:{params.remote_port}/v1/kv/{params.remote_handle}"
    shared = (shm_dir is not None and params.remote_engine_id
              and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", params.remote_engine_id)
              and shm_marker(shm_dir, params.remote_engine_id).exists())
    if shared:
        try:
            return await _pull_shm(client, url, token, fingerprint, shm_dir, timeout,
                                   (prompt_ids, rope, n_layer, n_head_kv, head_dim))
        except KvPullError as error:
            error.transport = "shm"
            raise
    reader = KvStreamReader(expect_fingerprint=fingerprint)
    layers: list[tuple[bytes, bytes]] = []
    header: KvHeader | None = None
    size = 0
    try:
        async with client.stream("GET", url, timeout=timeout,
                                 headers={"authorization": "Bearer " + token.decode()}) as response:
            if response.status_code != 200:
                await response.aread()
                raise KvPullError("kv_pull_refused", f"the exporting engine answered HTTP "
                                  f"{response.status_code} for the KV handle")
            async for chunk in response.aiter_raw():
                size += len(chunk)
                for event in reader.feed(chunk):
                    if event[0] == "header":
                        header = event[1]
                        _check_header(header, prompt_ids, rope, n_layer, n_head_kv, head_dim)
                    elif event[0] == "layer":
                        layers.append((event[2], event[3]))
            reader.finish()
    except KvProtocolError as error:
        code = "kv_model_mismatch" if "fingerprint" in str(error) else "kv_stream_invalid"
        raise KvPullError(code, str(error)) from None
    except httpx.HTTPError as error:
        raise KvPullError("kv_pull_failed", f"pulling the KV failed: {type(error).__name__}"
                          ) from None
    return PulledKv(header, layers, size, "tcp")


async def _pull_shm(client: httpx.AsyncClient, url: str, token: bytes, fingerprint: str,
                    shm_dir: Path, timeout: float, expect: tuple) -> PulledKv:
    """The exporter writes the stream into a file of the shared directory and answers its name;
    it is mapped (copy-on-write: the import reads it in place), unlinked, then verified."""
    try:
        response = await client.get(url, params={"transport": "shm"}, timeout=timeout,
                                    headers={"authorization": "Bearer " + token.decode()})
    except httpx.HTTPError as error:
        raise KvPullError("kv_pull_failed", f"pulling the KV failed: {type(error).__name__}"
                          ) from None
    if response.status_code != 200:
        raise KvPullError("kv_pull_refused", f"the exporting engine answered HTTP "
                          f"{response.status_code} for the KV handle")
    try:
        answer = response.json()
        name = answer["file"]
    except (ValueError, KeyError, TypeError):
        raise KvPullError("kv_stream_invalid", "the exporting engine's shared-memory answer "
                          "names no file") from None
    if not isinstance(name, str) or not SHM_FILE.fullmatch(name):
        raise KvPullError("kv_stream_invalid", "the exporting engine named an invalid "
                          "shared-memory file")
    path = shm_dir / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY) if size else b""
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except (OSError, ValueError) as error:
        raise KvPullError("kv_pull_failed", f"the shared-memory KV file is unreadable: "
                          f"{getattr(error, 'strerror', None) or error}") from None
    reader = KvStreamReader(expect_fingerprint=fingerprint)
    try:
        # The checksums of a long prompt's KV take tens of ms: off the event loop.
        header, layers = await asyncio.to_thread(reader.read_whole, mapped)
        _check_header(header, *expect)
    except KvProtocolError as error:
        code = "kv_model_mismatch" if "fingerprint" in str(error) else "kv_stream_invalid"
        raise KvPullError(code, str(error)) from None
    return PulledKv(header, layers, size, "shm")


def _check_header(header: KvHeader, prompt_ids: list[int], rope: str, n_layer: int,
                  n_head_kv: int, head_dim: int) -> None:
    if (header.rope, header.n_layer, header.n_head_kv, header.head_dim) != (
            rope, n_layer, n_head_kv, head_dim):
        raise KvProtocolError("model fingerprint mismatch: RoPE convention or KV shape differs")
    if header.tokens > len(prompt_ids) or header.token_ids != prompt_ids[:header.tokens]:
        raise KvProtocolError("the KV's tokens are not a prefix of this request's prompt")
