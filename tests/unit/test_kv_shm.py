"""The shared-memory pull's edge cases (kv_handoff/pull.py) that real engines never produce: an
exporter that names a path instead of a file, or a file that is not there. The happy path and
the TCP fallback run between real engines in tests/e2e/test_kv_shm.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from heteroserve_engines.kv_handoff.export import shm_directory, shm_marker
from heteroserve_engines.kv_handoff.pull import KvPullError, pull_kv
from heteroserve_engines.protocol.kv import KvTransferParams


def pull(tmp_path: Path, answer: dict, status: int = 200) -> KvPullError:
    shm_marker(tmp_path, "e1").write_text("1")
    secret = tmp_path.parent / "secret"
    secret.write_text("not KV")
    client = httpx.AsyncClient(transport=httpx.MockTransport(
        lambda request: httpx.Response(status, json=answer)))
    params = KvTransferParams(do_remote_prefill=True, remote_engine_id="e1",
                              remote_host="127.0.0.1", remote_port=1, remote_handle="h")
    with pytest.raises(KvPullError) as caught:
        asyncio.run(pull_kv(client, params, b"t" * 16, "f" * 64, [1, 2], "adjacent", 1, 1, 1,
                            shm_dir=tmp_path))
    assert caught.value.transport == "shm"
    return caught.value


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "kv-short", 7, None])
def test_a_file_name_that_is_not_one_of_ours_is_refused(tmp_path, name):
    error = pull(tmp_path, {"file": name})
    assert error.code == "kv_stream_invalid"


def test_a_missing_file_fails_the_pull(tmp_path):
    error = pull(tmp_path, {"file": "kv-" + "a" * 24})
    assert error.code == "kv_pull_failed" and "unreadable" in error.message


def test_a_refused_pull_says_so(tmp_path):
    assert pull(tmp_path, {"error": {}}, status=403).code == "kv_pull_refused"


def test_the_directory_must_exist(tmp_path):
    assert shm_directory(None) is None and shm_directory(str(tmp_path)) == tmp_path
    with pytest.raises(ValueError, match="no such directory"):
        shm_directory(str(tmp_path / "absent"))
