"""The operator as users run it: a `heteroserve-operator` process against the test cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.harness import free_port
from tests.processes import metric_value, stop_process

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "heteroserve.io_inferencedeployments.yaml"
SAMPLES = REPO / "crds" / "samples"


def wait_for(predicate, timeout: float = 60, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class OperatorProcess:
    """`extra_args`: more command-line arguments (e.g. --peering NAME --priority N); `name`
    prefixes the log files (operator-1.log, operator-2.log, ... one per start)."""

    def __init__(self, kubeconfig: Path, logdir: Path, extra_args: tuple[str, ...] = (),
                 name: str = "operator"):
        self.kubeconfig, self.logdir = kubeconfig, logdir
        self.extra_args, self.name = extra_args, name
        self.proc: subprocess.Popen | None = None
        self.metrics_port = 0
        self.starts = 0

    def start(self, wait: bool = True) -> None:
        """`wait`: return once the metrics endpoint answers (the process has parsed its
        arguments and is connecting); else at once."""
        self.metrics_port = free_port()
        self.starts += 1
        self.log_path = self.logdir / f"{self.name}-{self.starts}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "heteroserve_operator", "--metrics-port",
             str(self.metrics_port), "--liveness", "", "--resync-seconds", "10",
             *self.extra_args],
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait:
            wait_for(self._metrics_up, 30, what="the operator's metrics endpoint")

    def kill(self) -> None:
        """SIGKILL: no clean-up, no last keep-alive, as when a node dies."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _metrics_up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited with {self.proc.returncode}; see "
                                 f"{self.logdir}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2
                             ).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=5).text, name, **labels)

    def stop(self) -> None:
        stop_process(self.proc)


@pytest.fixture(scope="session")
def crd_installed(cluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/inferencedeployments.heteroserve.io")


@pytest.fixture(scope="session")
def operator(cluster, crd_installed, tmp_path_factory) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def get_json(cluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def condition(obj: dict, kind: str) -> dict | None:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind),
                None)


def wait_ready(cluster, namespace: str, name: str, timeout: float = 90) -> dict:
    seen: dict = {}

    def ready():
        obj = get_json(cluster, "inferencedeployment", name, "-n", namespace)
        seen["status"] = obj.get("status")
        cond = condition(obj, "Ready")
        current = obj.get("status", {}).get("observedGeneration") == obj["metadata"][
            "generation"]
        return obj if cond and cond["status"] == "True" and current else None

    try:
        return wait_for(ready, timeout, what=f"{namespace}/{name} to be Ready")
    except AssertionError as error:
        # What the operator last said, and what the cluster had: a timeout alone tells nothing.
        children = cluster.kubectl("get", "deployments,pods,endpointslices", "-n", namespace,
                                   "-o", "wide", check=False).stdout
        raise AssertionError(f"{error}\nlast status: {seen.get('status')!r}\n{children}") \
            from None
