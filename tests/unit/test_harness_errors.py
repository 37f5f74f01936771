"""When a piece is missing the harness says which one and how to use an existing cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cluster import harness

BUILD_TOOLS = Path(harness.__file__).with_name("build-tools.sh")


def test_missing_go_names_the_piece_and_the_fallback(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "BIN", tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` here
    with pytest.raises(harness.HarnessError) as error:
        harness.ensure_binaries()
    message = str(error.value)
    assert "'go' tool" in message and "kube-apiserver" in message
    assert harness.EXISTING_CLUSTER_ENV in message and "kind" in message


def test_no_build_reports_missing_binaries(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "BIN", tmp_path / "bin")
    with pytest.raises(harness.HarnessError, match="missing test control-plane binaries"):
        harness.ensure_binaries(build=False)


def test_build_script_without_go_stops_with_a_message(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "HETEROSERVE_CACHE": str(tmp_path / "cache")}
    if any(Path(p, "go").exists() for p in env["PATH"].split(os.pathsep)):
        pytest.fail("a `go` in /usr/bin or /bin defeats this test; adjust its PATH")
    result = subprocess.run(["bash", str(BUILD_TOOLS)], env=env, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 1
    assert "the 'go' tool is missing" in result.stderr
    assert "KUBECONFIG" in result.stderr


def test_build_script_with_an_unreachable_module_proxy(tmp_path):
    env = {**os.environ, "HETEROSERVE_CACHE": str(tmp_path / "cache"),
           "GOPROXY": "http://127.0.0.1:9", "GOFLAGS": "-mod=mod", "GOMODCACHE":
           str(tmp_path / "modcache"), "GONOSUMDB": "*", "GOFLAGS_EXTRA": ""}
    result = subprocess.run(["bash", str(BUILD_TOOLS), "etcd"], env=env, capture_output=True,
                            text=True, check=False, timeout=120)
    assert result.returncode == 1
    assert "cannot download go.etcd.io/etcd/server/v3" in result.stderr
