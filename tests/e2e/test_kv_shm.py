"""The KV hand-off through shared memory (docs/kv-handoff.md, "Same node"): two real CPU engines
that mount one memory-backed directory hand the KV over through a file in it instead of TCP; an
engine with a directory of its own falls back to TCP. The exporter is a CPU engine (its KV is
bit-identical to what the decoder would compute, so the answers must match exactly; all on the
batch-invariant variant, as in test_kv_handoff.py)."""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import start_engine, stop_engine
from tests.e2e.test_kv_handoff import chat, prefill, url
from tests.e2e.test_router import ONE_CORE
from tests.processes import metric_value
from tests.variants import BATCH_INVARIANT


def shared_memory_folder(prefix: str) -> Path:
    """A folder on tmpfs where the machine has one (/dev/shm), as a memory-backed emptyDir is."""
    root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


@pytest.fixture(scope="module")
def shm_dirs():
    shared, own = shared_memory_folder("hs-kv-shared-"), shared_memory_folder("hs-kv-own-")
    yield shared, own
    for folder in (shared, own):
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


@pytest.fixture(scope="module")
def engines(tmp_path_factory, shm_dirs):
    """An exporter and a decoder on one shared directory, and a decoder on a directory of its
    own (another node, as far as shared memory goes)."""
    token = tmp_path_factory.mktemp("kv") / "kv-token"
    token.write_text(secrets.token_urlsafe(24))
    shared, own = shm_dirs
    common = ("--max-model-len", "512", "--kv-token-file", str(token), "--kernels", BATCH_INVARIANT)
    started = []
    try:
        for index, folder in enumerate((shared, shared, own)):
            # The exporter advertises its address, as a pod does its IP.
            advertise = ("--kv-advertise-host", "127.0.0.1") if index == 0 else ()
            started.append(start_engine(tmp_path_factory.mktemp(f"engine{index}"), *common,
                                        "--kv-shm-dir", str(folder), *advertise,
                                        env=ONE_CORE[min(index, 1)]))
        yield started
    finally:
        for engine in started:
            stop_engine(engine)


def pulls(engine, transport: str, outcome: str = "ok") -> float:
    text = httpx.get(url(engine) + "/metrics", timeout=5).text
    return metric_value(text, "heteroserve:kv_pulls_total", transport=transport, outcome=outcome)


def test_same_directory_hands_the_kv_over_through_shared_memory(engines, shm_dirs):
    exporter, decoder, _ = engines
    shared = shm_dirs[0]
    content = "Tell me one fact about the number 7."
    alone = chat(url(decoder), content).json()["choices"][0]["message"]["content"]
    shm_before, tcp_before = pulls(decoder, "shm"), pulls(decoder, "tcp")
    imported_before = decoder.metric("heteroserve:kv_imported_tokens_total")
    params = prefill(exporter, content)
    handed = chat(url(decoder), content, kv_transfer_params=params)
    assert handed.status_code == 200, handed.text
    assert handed.json()["choices"][0]["message"]["content"] == alone
    assert pulls(decoder, "shm") - shm_before == 1
    assert pulls(decoder, "tcp") == tcp_before
    assert decoder.metric("heteroserve:kv_imported_tokens_total") > imported_before
    # The stream's file was unlinked by the decoder: only the exporters' markers remain.
    assert sorted(p.name.split("-")[0] for p in shared.iterdir()) == ["exporter", "exporter"]


def test_another_directory_falls_back_to_tcp(engines):
    exporter, _, elsewhere = engines
    content = "Name a color."
    alone = chat(url(elsewhere), content).json()["choices"][0]["message"]["content"]
    shm_before, tcp_before = pulls(elsewhere, "shm"), pulls(elsewhere, "tcp")
    handed = chat(url(elsewhere), content, kv_transfer_params=prefill(exporter, content))
    assert handed.status_code == 200, handed.text
    assert handed.json()["choices"][0]["message"]["content"] == alone
    assert pulls(elsewhere, "tcp") - tcp_before == 1
    assert pulls(elsewhere, "shm") == shm_before


def test_a_shared_memory_pull_needs_the_token(engines, shm_dirs):
    exporter = engines[0]
    params = prefill(exporter, "Hello there")
    kv_url = f"{url(exporter)}/v1/kv/{params['remote_handle']}"
    refused = httpx.get(kv_url, params={"transport": "shm"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "kv_forbidden"
    # Nothing was written for the refused pull.
    assert not [p for p in shm_dirs[0].iterdir() if p.name.startswith("kv-")]


def test_a_missing_directory_is_a_clear_start_up_error(tmp_path):
    engine = start_engine(tmp_path, "--kv-shm-dir", str(tmp_path / "absent"), wait=False)
    try:
        assert engine.proc.wait(timeout=120) == 2
    finally:
        stop_engine(engine)
    assert "--kv-shm-dir" in engine.log.read_text() and "no such directory" in \
        engine.log.read_text()


def test_the_exporter_answers_the_address_it_advertises(engines):
    """--kv-advertise-host: the answer carries it (a decode engine in another pod pulls from
    there); an engine without it leaves the address to the router."""
    exporter, decoder, _ = engines
    for engine, expected in ((exporter, "127.0.0.1"), (decoder, None)):
        answer = chat(url(engine), "Hi", 1, kv_transfer_params={"do_remote_decode": True})
        assert answer.status_code == 200, answer.text
        assert answer.json()["kv_transfer_params"]["remote_host"] == expected
