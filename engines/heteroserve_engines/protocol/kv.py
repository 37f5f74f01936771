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
    head, crc = encode_frame_head(layer, k_rows, v_rows)
    return head + k_rows + v_rows + _U32.pack(crc)


def encode_frame_head(layer: int, k_rows: bytes, v_rows: bytes) -> tuple[bytes, int]:
    """A frame's first 8 bytes and its CRC (its last 4), for writers that send the rows
    themselves without joining them."""
    return (_FRAME.pack(layer, len(k_rows) + len(v_rows)),
            zlib.crc32(v_rows, zlib.crc32(k_rows)))


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
    the stream ended complete. `read_whole(buffer)` parses a stream that is already in memory
    (a shared-memory file) without copying it: its K and V rows are views into the buffer."""

    def __init__(self, expect_fingerprint: str | None = None):
        self.expect_fingerprint = expect_fingerprint
        self.buffer: bytearray | memoryview = bytearray()
        self.pos = 0  # where the unparsed bytes of `buffer` start
        self.header: KvHeader | None = None
        self.frame_crcs: list[int] = []
        self.ended = False

    def feed(self, data: bytes) -> list[tuple]:
        if self.ended and data:
            raise KvProtocolError("bytes after the end of the KV stream")
        if self.pos:
            del self.buffer[:self.pos]
            self.pos = 0
        self.buffer += data
        return self._events()

    def read_whole(self, buffer) -> tuple[KvHeader, list[tuple[memoryview, memoryview]]]:
        """The header and every layer's (K rows, V rows) of a complete stream in `buffer`
        (anything with the buffer protocol); every checksum is verified first."""
        self.buffer, self.pos = memoryview(buffer).cast("B"), 0
        layers = [(event[2], event[3]) for event in self._events() if event[0] == "layer"]
        self.finish()
        if self.pos != len(self.buffer):
            raise KvProtocolError("bytes after the end of the KV stream")
        return self.header, layers

    def finish(self) -> None:
        if not self.ended:
            got = len(self.frame_crcs)
            raise KvProtocolError(f"the KV stream ended early (after {got} of "
                                  f"{self.header.n_layer if self.header else '?'} layers)")

    def _events(self) -> list[tuple]:
        events: list[tuple] = []
        while True:
            event = self._next()
            if event is None:
                return events
            events.append(event)

    def _available(self) -> int:
        return len(self.buffer) - self.pos

    def _take(self, size: int) -> bytes | memoryview:
        """The next `size` bytes: a copy from the incremental buffer (which is compacted
        later), a view of a whole buffer."""
        start = self.pos
        self.pos += size
        piece = self.buffer[start:self.pos]
        return piece if isinstance(piece, memoryview) else bytes(piece)

    def _next(self) -> tuple | None:
        if self.header is None:
            if self._available() < _PREAMBLE.size:
                return None
            magic, version, length = _PREAMBLE.unpack_from(self.buffer, self.pos)
            if magic != MAGIC:
                raise KvProtocolError("not a KV stream (bad magic)")
            if version != VERSION:
                raise KvProtocolError(f"KV stream version {version}; this engine reads "
                                      f"version {VERSION}")
            if length > MAX_HEADER_BYTES:
                raise KvProtocolError(f"KV header of {length} bytes is too large")
            if self._available() < _PREAMBLE.size + length:
                return None
            self.pos += _PREAMBLE.size
            raw = bytes(self._take(length))
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
            if self._available():
                raise KvProtocolError("bytes after the end of the KV stream")
            return None
        if self._available() < _FRAME.size:
            return None
        layer, length = _FRAME.unpack_from(self.buffer, self.pos)
        if layer == END_OF_FRAMES:
            if self._available() < _TRAILER.size:
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
        if self._available() < _FRAME.size + length + _U32.size:
            return None
        self.pos += _FRAME.size
        half = length // 2
        k_rows, v_rows = self._take(half), self._take(half)
        (crc,) = _U32.unpack(self._take(_U32.size))
        if crc != zlib.crc32(v_rows, zlib.crc32(k_rows)):
            raise KvProtocolError(f"KV frame of layer {layer} fails its checksum")
        self.frame_crcs.append(crc)
        return ("layer", layer, k_rows, v_rows)
