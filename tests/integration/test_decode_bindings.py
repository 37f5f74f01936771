"""status.decodeBindings on the real test control plane, from a real CPU engine: the operator
reads the CPUs the engine actually bound from its /metrics and writes them once.

kwok runs no container, so the test runs the decode pod's engine container itself, as its spec
says (command, args, env; see test_rendered_pods_serve.py), under `taskset`, on loopback. The
pod's IP is where a CNI would put it; here the test writes 127.0.0.1 into the pod's status
(kwok writes a pod's status once, when it starts the pod, and leaves it alone after), which is
the only stand-in: the operator process is the one users run, reading the pod's IP and port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from heteroserve_engines.cpu_engine.affinity import numa_nodes_of
from tests.cluster.harness import free_port
from tests.integration.conftest import SAMPLES, get_json, wait_for, wait_ready
from tests.integration.test_rendered_pods_serve import container_process
from tests.processes import stop_process

pytestmark = pytest.mark.integration


def decode_pod(cluster, namespace: str, name: str) -> dict:
    (pod,) = get_json(cluster, "pods", "-n", namespace, "-l",
                      f"app.kubernetes.io/instance={name},app.kubernetes.io/component=decode"
                      )["items"]
    return pod


def bindings(cluster, namespace: str, name: str) -> list[dict] | None:
    return get_json(cluster, "inferencedeployment", name, "-n", namespace).get(
        "status", {}).get("decodeBindings")


def engine_started_at(pod: dict) -> str:
    (engine,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "engine"]
    return engine["state"]["running"]["startedAt"]


class Engine:
    """The decode pod's engine container as a process pinned with `taskset -c <cpu>`."""

    def __init__(self, cluster, namespace: str, pod: dict, port: int, tmp_path: Path):
        self.cluster, self.namespace, self.pod, self.port = cluster, namespace, pod, port
        self.tmp_path = tmp_path
        self.proc: subprocess.Popen | None = None

    def start(self, cpu: int) -> None:
        configmaps = {cm["metadata"]["name"]: cm for cm in get_json(
            self.cluster, "configmaps", "-n", self.namespace)["items"]}
        (container,) = [c for c in self.pod["spec"]["containers"] if c["name"] == "engine"]
        argv, env = container_process(self.pod, container, configmaps, self.tmp_path)
        self.log = self.tmp_path / f"engine-cpu{cpu}.log"
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv],
                                         env={**os.environ, "PATH": path, **env},
                                         stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/health",
                                 timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 120, what="the engine to load")

    def stop(self) -> None:
        stop_process(self.proc)


def patch_pod_status(cluster, namespace: str, pod: str, patch: list[dict]) -> None:
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                    "--type=json", "-p", json.dumps(patch))


def quiet_writes(operator, quiet_s: float = 5.0, timeout_s: float = 120.0) -> float:
    """The operator's status-write count once it has not moved for `quiet_s`."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = operator.metric("heteroserve_operator_api_writes_total", verb="patch-status")
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.5)
    raise AssertionError(f"the operator kept writing status for {timeout_s:.0f} s")


def test_status_shows_the_cpus_taskset_granted_and_writes_them_once(cluster, operator,
                                                                    namespace, tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    first_cpu, second_cpu = allowed[-1], allowed[0]
    sample = yaml.safe_load((SAMPLES / "builtin-smollm2-cpu.yaml").read_text())
    name, spec = sample["metadata"]["name"], sample["spec"]
    port = free_port()
    # One CPU: heteroserve-bind binds the one CPU taskset grants, whatever the fake node's plan.
    spec["decode"].update(cpus=1, numaNodes=1, engine={"port": port})
    spec["router"]["port"] = free_port()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    wait_ready(cluster, namespace, name)
    pod = decode_pod(cluster, namespace, name)
    pod_name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    # Engine pods carry no API token: what they bound reaches the status through /metrics.
    assert pod["spec"]["automountServiceAccountToken"] is False
    # kwok's pod IP routes nowhere: the engine is not read, and shows so.
    wait_for(lambda: bindings(cluster, namespace, name) == [
        {"pod": pod_name, "node": node, "state": "Unknown"}], 30,
        what="the decode pod's entry, Unknown")

    engine = Engine(cluster, namespace, pod, port, tmp_path)
    try:
        engine.start(first_cpu)
        patch_pod_status(cluster, namespace, pod_name, [
            {"op": "replace", "path": "/status/podIP", "value": "127.0.0.1"},
            {"op": "replace", "path": "/status/podIPs", "value": [{"ip": "127.0.0.1"}]}])

        def reported(cpu: int, started: str):
            want = [{"pod": pod_name, "node": node, "state": "Reported", "cpus": str(cpu),
                     "threads": 1, "numaNodes": sorted(set(numa_nodes_of([cpu]).values())),
                     "engineStartedAt": started}]
            return lambda: bindings(cluster, namespace, name) == want

        wait_for(reported(first_cpu, engine_started_at(pod)), 30,
                 what=f"decodeBindings to show CPU {first_cpu}")

        # Unchanged: a pod event and a reconcile later, not one write and not one more read.
        # The operator is shared with the other tests: objects they left behind (namespaces
        # still being deleted) may still be written to, so first wait for a quiet spell.
        writes = quiet_writes(operator)
        obj = get_json(cluster, "inferencedeployment", name, "-n", namespace)
        version = obj["metadata"]["resourceVersion"]
        # Only this test's engine can be read successfully (other pods' IPs route nowhere).
        reads = operator.metric("heteroserve_operator_binding_scrapes_total", result="reported")
        cluster.kubectl("annotate", "pod", pod_name, "-n", namespace, "example.com/poke=1")
        time.sleep(5)
        obj = get_json(cluster, "inferencedeployment", name, "-n", namespace)
        assert obj["metadata"]["resourceVersion"] == version
        assert operator.metric("heteroserve_operator_api_writes_total",
                               verb="patch-status") == writes
        assert operator.metric("heteroserve_operator_binding_scrapes_total",
                               result="reported") == reads

        # The container "restarts" on another CPU: the new start is read, not the old report.
        engine.stop()
        engine.start(second_cpu)
        restarted = "2030-01-01T00:00:00Z"
        patch_pod_status(cluster, namespace, pod_name, [
            {"op": "replace", "path": "/status/containerStatuses/0/state/running/startedAt",
             "value": restarted}])
        assert decode_pod(cluster, namespace, name)["status"]["containerStatuses"][0][
            "name"] == "engine"
        wait_for(reported(second_cpu, restarted), 30,
                 what=f"decodeBindings to show CPU {second_cpu} after the restart")
    finally:
        engine.stop()
        cluster.kubectl("delete", "inferencedeployment", name, "-n", namespace,
                        "--wait=false", check=False)
