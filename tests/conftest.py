"""Shared fixtures. The `cluster` fixture starts the real test control plane once per session
(or attaches to HETEROSERVE_TEST_KUBECONFIG); it never skips: a missing piece is an error that says
what is missing."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import (
    EXISTING_CLUSTER_ENV,
    ControlPlane,
    ensure_binaries,
    kubectl,
)


class Cluster:
    """What tests get: the kubeconfig, kubectl, and API clients bound to the test cluster."""

    def __init__(self, plane: ControlPlane):
        self.plane = plane
        self.kubeconfig: Path = plane.kubeconfig

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True):
        return kubectl(self.kubeconfig, *args, stdin=stdin, check=check)

    def api_client(self):
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


CLUSTER_TIMINGS = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter, config):
    if CLUSTER_TIMINGS in config.stash:
        terminalreporter.write_line(config.stash[CLUSTER_TIMINGS])


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    plane = ControlPlane(workdir, log=lambda message: print(message, flush=True))
    existing = os.environ.get(EXISTING_CLUSTER_ENV)
    if existing:
        plane.attach(Path(existing))
        request.config.stash[CLUSTER_TIMINGS] = f"test cluster: attached to {existing}"
    else:
        build_s = ensure_binaries()
        started = time.monotonic()
        plane.start()
        request.config.stash[CLUSTER_TIMINGS] = (
            f"test cluster: binaries built in {build_s:.0f} s (0 = cached in "
            f"~/.cache/heteroserve/bin), control plane + fake nodes up in "
            f"{time.monotonic() - started:.1f} s")
    try:
        yield Cluster(plane)
    finally:
        plane.stop()


@contextlib.contextmanager
def temporary_namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (without waiting for its finalization)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test."""
    with temporary_namespace(cluster) as name:
        yield name
