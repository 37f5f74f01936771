"""The KV hand-off: the request fields (vLLM's `kv_transfer_params` shape) and the binary stream a
decode engine pulls from a prefill engine (docs/kv-handoff.md).

Stream layout, version 1 (all integers little-endian):

    preamble   b"HSKV" | u16 version | u32 header length | header (UTF-8 JSON, KvHeader)
    frame *    u32 layer | u32 payload length | K rows | V rows | u32 CRC-32 of K rows + V rows
    trailer    u32 0xFFFFFFFF | u32 frame count | u32 CRC-32 of the header and every frame CRC

Each frame is one layer (layers in order, so the receiver imports a layer while the next one is
on the wire); K and V rows are `tokens` x `n_head_kv * head_dim` values of `dtype`, token-major,
K after RoPE in the header's convention. A stream that ends early, a frame out of order or a CRC
that does not match is refused whole: the receiver imports nothing it has not verified.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAGIC = b"HSKV"
VERSION = 1
MEDIA_TYPE = "application/x-heteroserve-kv"
END_OF_FRAMES = 0xFFFFFFFF
DTYPE_BYTES = {"float16": 2}
_PREAMBLE = struct.Struct("<4sHI")
_FRAME = struct.Struct("<II")
_U32 = struct.Struct("<I")
_TRAILER = struct.Struct("<III")
# A header is a few hundred bytes plus the prompt's token ids.
MAX_HEADER_BYTES = 16 * 2**20


class KvProtocolError(ValueError):
    """A KV stream that is not version 1, is truncated, out of order or fails its checksum."""


class KvTransferParams(BaseModel):
    """The request and response field `kv_transfer_params`, in vLLM's disaggregated-serving
    shape (NixlConnector), plus the handle and token heteroserve's pull needs."""

    model_config = ConfigDict(extra="allow")

    do_remote_decode: bool = False  # to a prefill engine: keep the KV for a remote decode
    do_remote_prefill: bool = False  # to a decode engine: the KV is remote, pull it
    remote_engine_id: str | None = None
    remote_block_ids: list[int] | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_handle: str | None = None  # heteroserve: the prefill engine's id of the stored KV


class KvHeader(BaseModel):
    """What the receiver checks before it imports a single row."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    model_fingerprint: str = Field(min_length=16)
    dtype: Literal["float16"] = "float16"
    rope: Literal["adjacent", "neox"]  # GGUF llama pairs (x[2i], x[2i+1]); NeoX/Qwen2 halves
    layout: Literal["layer-frames/token-major"] = "layer-frames/token-major"
    n_layer: int = Field(ge=1)
    n_head_kv: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    tokens: int = Field(ge=1)
    token_ids: list[int]  # the tokens whose KV is sent, in order (positions 0..tokens-1)
    handle: str = ""

    @property
    def frame_payload_bytes(self) -> int:
        return 2 * self.tokens * self.n_head_kv * self.head_dim * DTYPE_BYTES[self.dtype]


def model_fingerprint(description: dict[str, Any]) -> str:
    """A digest of a model's identity: architecture, shapes and the digests of its weights, as
    each engine describes the file it loaded (canonical JSON, SHA-256)."""
    canonical = json.dumps(description, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def encode_preamble(header: KvHeader) -> bytes:
    body = header.model_dump_json().encode()
    return _PREAMBLE.pack(MAGIC, VERSION, len(body)) + body


def encode_frame(layer: int, k_rows: bytes, v_rows: bytes) -> bytes:
    crc = zlib.crc32(v_rows, zlib.crc32(k_rows))
    return _FRAME.pack(layer, len(k_rows) + len(v_rows)) + k_rows + v_rows + _U32.pack(crc)


def encode_trailer(header: KvHeader, frame_crcs: list[int]) -> bytes:
    return _TRAILER.pack(END_OF_FRAMES, len(frame_crcs), _stream_crc(header, frame_crcs))


def encode_stream(header: KvHeader, layers: list[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """The whole stream, one piece per layer (for senders that hold every layer already)."""
    yield encode_preamble(header)
    crcs = []
    for index, (k_rows, v_rows) in enumerate(layers):
        frame = encode_frame(index, k_rows, v_rows)
        crcs.append(_U32.unpack_from(frame, len(frame) - 4)[0])
        yield frame
    yield encode_trailer(header, crcs)


def _stream_crc(header: KvHeader, frame_crcs: list[int]) -> int:
    crc = zlib.crc32(header.model_dump_json().encode())
    for value in frame_crcs:
        crc = zlib.crc32(_U32.pack(value), crc)
    return crc


class KvStreamReader:
    """An incremental parser: `feed(bytes)` returns the events the bytes completed —
    ("header", KvHeader), ("layer", index, k_rows, v_rows), ("end",) — and raises
    KvProtocolError on anything that is not a valid version-1 stream. `finish()` says whether
    the stream ended complete."""

    def __init__(self, expect_fingerprint: str | None = None):
        self.expect_fingerprint = expect_fingerprint
        self.buffer = bytearray()
        self.header: KvHeader | None = None
        self.frame_crcs: list[int] = []
        self.ended = False

    def feed(self, data: bytes) -> list[tuple]:
        if self.ended and data:
            raise KvProtocolError("bytes after the end of the KV stream")
        self.buffer += data
        events: list[tuple] = []
        while True:
            event = self._next()
            if event is None:
                return events
            events.append(event)

    def finish(self) -> None:
        if not self.ended:
            got = len(self.frame_crcs)
            raise KvProtocolError(f"the KV stream ended early (after {got} of "
                                  f"{self.header.n_layer if self.header else '?'} layers)")

    def _take(self, size: int) -> bytes | None:
        if len(self.buffer) < size:
            return None
        piece = bytes(self.buffer[:size])
        del self.buffer[:size]
        return piece

    def _next(self) -> tuple | None:
        if self.header is None:
            if len(self.buffer) < _PREAMBLE.size:
                return None
            magic, version, length = _PREAMBLE.unpack_from(self.buffer)
            if magic != MAGIC:
                raise KvProtocolError("not a KV stream (bad magic)")
            if version != VERSION:
                raise KvProtocolError(f"KV stream version {version}; this engine reads "
                                      f"version {VERSION}")
            if length > MAX_HEADER_BYTES:
                raise KvProtocolError(f"KV header of {length} bytes is too large")
            if len(self.buffer) < _PREAMBLE.size + length:
                return None
            del self.buffer[:_PREAMBLE.size]
            raw = self._take(length)
            try:
                header = KvHeader.model_validate_json(raw)
            except ValidationError as error:
                raise KvProtocolError(f"invalid KV header: {error.errors()[0]['msg']}") from None
            if len(header.token_ids) != header.tokens:
                raise KvProtocolError("KV header: token_ids does not list `tokens` ids")
            if self.expect_fingerprint and header.model_fingerprint != self.expect_fingerprint:
                raise KvProtocolError("model fingerprint mismatch: the KV was computed by "
                                      "another model (or another copy of its weights)")
            self.header = header
            return ("header", header)
        if self.ended:
            if self.buffer:
                raise KvProtocolError("bytes after the end of the KV stream")
            return None
        if len(self.buffer) < _FRAME.size:
            return None
        layer, length = _FRAME.unpack_from(self.buffer)
        if layer == END_OF_FRAMES:
            if len(self.buffer) < _TRAILER.size:
                return None
            _, count, crc = _TRAILER.unpack(self._take(_TRAILER.size))
            if count != self.header.n_layer or count != len(self.frame_crcs):
                raise KvProtocolError(f"KV stream ended after {len(self.frame_crcs)} of "
                                      f"{self.header.n_layer} layers")
            if crc != _stream_crc(self.header, self.frame_crcs):
                raise KvProtocolError("KV stream checksum mismatch (trailer)")
            self.ended = True
            return ("end",)
        if layer != len(self.frame_crcs) or layer >= self.header.n_layer:
            raise KvProtocolError(f"KV frame for layer {layer} where layer "
                                  f"{len(self.frame_crcs)} was due")
        if length != self.header.frame_payload_bytes:
            raise KvProtocolError(f"KV frame of {length} bytes; the header implies "
                                  f"{self.header.frame_payload_bytes}")
        if len(self.buffer) < _FRAME.size + length + _U32.size:
            return None
        del self.buffer[:_FRAME.size]
        payload = self._take(length)
        (crc,) = _U32.unpack(self._take(_U32.size))
        half = length // 2
        k_rows, v_rows = payload[:half], payload[half:]
        if crc != zlib.crc32(v_rows, zlib.crc32(k_rows)):
            raise KvProtocolError(f"KV frame of layer {layer} fails its checksum")
        self.frame_crcs.append(crc)
        return ("layer", layer, k_rows, v_rows)
