"""The KV hand-off stream (protocol/kv.py): round trips in any chunking, and every corruption
refused before anything is imported."""

from __future__ import annotations

import os
import random

import pytest

from heteroserve_engines.protocol.kv import (
    KvHeader,
    KvProtocolError,
    KvStreamReader,
    KvTransferParams,
    encode_stream,
    model_fingerprint,
)

FINGERPRINT = model_fingerprint({"arch": "llama", "n_layer": 3, "weights": "abc"})


def header(**changes) -> KvHeader:
    fields = {"model_fingerprint": FINGERPRINT, "rope": "adjacent", "n_layer": 3,
              "n_head_kv": 2, "head_dim": 4, "tokens": 5, "token_ids": [1, 2, 3, 4, 5],
              "handle": "h1"}
    return KvHeader(**{**fields, **changes})


def layers(h: KvHeader) -> list[tuple[bytes, bytes]]:
    size = h.frame_payload_bytes // 2
    return [(os.urandom(size), os.urandom(size)) for _ in range(h.n_layer)]


def stream(h: KvHeader, data: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(encode_stream(h, data))


def read(raw: bytes, chunk: int | None = None, fingerprint: str | None = FINGERPRINT):
    reader = KvStreamReader(fingerprint)
    events = []
    step = chunk or len(raw) or 1
    for start in range(0, len(raw), step):
        events += reader.feed(raw[start:start + step])
    reader.finish()
    return events


@pytest.mark.parametrize("chunk", [None, 1, 7, 4096])
def test_round_trip_in_any_chunking(chunk):
    h = header()
    data = layers(h)
    events = read(stream(h, data), chunk)
    assert events[0] == ("header", h)
    assert [e[1:] for e in events[1:-1]] == [(i, k, v) for i, (k, v) in enumerate(data)]
    assert events[-1] == ("end",)


def test_fingerprint_mismatch_is_refused_at_the_header():
    raw = stream(header(), layers(header()))
    with pytest.raises(KvProtocolError, match="fingerprint"):
        read(raw, fingerprint=model_fingerprint({"arch": "other"}))


def test_every_flipped_byte_is_caught():
    h = header()
    raw = bytearray(stream(h, layers(h)))
    rng = random.Random(7)
    for index in rng.sample(range(len(raw)), 60):
        corrupted = bytearray(raw)
        corrupted[index] ^= 0x5A
        with pytest.raises(KvProtocolError):
            read(bytes(corrupted))


@pytest.mark.parametrize("cut", [3, 20, 200, -13, -1])
def test_truncated_stream_is_refused(cut):
    raw = stream(header(), layers(header()))
    with pytest.raises(KvProtocolError):
        read(raw[:cut])


def test_frames_out_of_order_and_trailing_bytes_are_refused():
    h = header()
    data = layers(h)
    pieces = list(encode_stream(h, data))
    swapped = pieces[0] + pieces[2] + pieces[1] + pieces[3] + pieces[4]
    with pytest.raises(KvProtocolError, match="layer 1 where layer 0"):
        read(swapped)
    with pytest.raises(KvProtocolError, match="after the end"):
        read(stream(h, data) + b"x")


def test_version_and_header_checks():
    raw = bytearray(stream(header(), layers(header())))
    raw[4] = 9  # version 9
    with pytest.raises(KvProtocolError, match="version 9"):
        read(bytes(raw))
    with pytest.raises(KvProtocolError, match="bad magic"):
        read(b"GGUF" + bytes(raw[4:]))
    bad = header(tokens=4)  # four tokens announced, five ids listed
    with pytest.raises(KvProtocolError, match="token_ids"):
        read(stream(bad, layers(bad)))


def test_transfer_params_keep_vllm_fields_and_extras():
    params = KvTransferParams.model_validate({
        "do_remote_decode": True, "remote_engine_id": "e1", "remote_block_ids": [1, 2],
        "remote_host": "10.0.0.1", "remote_port": 8001, "tp_size": 1})
    dumped = params.model_dump()
    assert dumped["tp_size"] == 1 and dumped["remote_block_ids"] == [1, 2]
    assert not params.do_remote_prefill and params.remote_handle is None


def test_a_whole_buffer_is_read_in_place_and_checked_like_a_stream():
    """read_whole (the shared-memory path): views into the buffer, the same refusals."""
    h = header()
    data = layers(h)
    raw = bytearray(stream(h, data))
    got_header, got = KvStreamReader(FINGERPRINT).read_whole(raw)
    assert got_header == h and [(bytes(k), bytes(v)) for k, v in got] == data
    assert isinstance(got[0][0], memoryview) and got[0][0].obj is raw  # not copied
    rng = random.Random(11)
    for index in rng.sample(range(len(raw)), 40):
        corrupted = bytearray(raw)
        corrupted[index] ^= 0x5A
        with pytest.raises(KvProtocolError):
            KvStreamReader(FINGERPRINT).read_whole(corrupted)
    for cut in (20, -13, -1):
        with pytest.raises(KvProtocolError):
            KvStreamReader(FINGERPRINT).read_whole(raw[:cut])
    with pytest.raises(KvProtocolError, match="after the end"):
        KvStreamReader(FINGERPRINT).read_whole(raw + b"x")
