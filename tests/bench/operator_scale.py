"""Operator scale benchmark (a script, not a test): N InferenceDeployments on M fake nodes.

    .venv/bin/python -m tests.bench.operator_scale --objects 1000 --nodes 100

Starts its own test control plane (kwok nodes: 4/5 CPU servers of 64 CPUs over 2 NUMA nodes,
1/5 Kunpeng GPU servers of 160 CPUs over 4 NUMA nodes with 8 GPUs), runs the operator as a
process, creates the objects (85 % CPU-only, 15 % GPU prefill + CPU decode) and prints a table:
time from create to Ready (p50/p99), API writes per object while converging, writes while idle
(including resyncs), and the operator's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.cluster.catalogue import FakeNode, NumaZone
from tests.cluster.harness import ControlPlane, ensure_binaries, free_port

GROUP, VERSION, PLURAL = "heteroserve.io", "v1alpha1", "inferencedeployments"
REPO = Path(__file__).resolve().parents[2]


def bench_nodes(count: int) -> list[FakeNode]:
    nodes = []
    for index in range(count):
        if index % 5 == 0:
            nodes.append(FakeNode(
                name=f"gpu-{index:03d}", description="Kunpeng + 8 GPUs", arch="arm64",
                capacity={"cpu": "160", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                numa=[NumaZone(f"{n * 40}-{n * 40 + 39}", "256Gi",
                               {"nvidia.com/gpu": "2"}) for n in range(4)]))
        else:
            nodes.append(FakeNode(
                name=f"cpu-{index:03d}", description="x86 CPU server", arch="amd64",
                capacity={"cpu": "64", "memory": "256Gi", "pods": "110"}, threads_per_core=2,
                numa=[NumaZone("0-15,32-47", "128Gi"), NumaZone("16-31,48-63", "128Gi")]))
    return nodes


def spec(index: int) -> dict:
    if index % 20 < 3:
        return {"model": {"name": f"m{index}", "path": "/models/m.gguf"},
                "prefill": {"accelerator": {"type": "nvidia", "count": 1},
                            "engine": {"kind": "builtin"}, "memory": "8Gi"},
                "decode": {"cpus": 4, "numaNodes": 2, "memory": "4Gi"}}
    return {"model": {"name": f"m{index}", "path": "/models/m.gguf"},
            "decode": {"cpus": 2, "numaNodes": 1, "memory": "2Gi"}, "router": {"policy": "cpu"}}


def metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def baseline(plane: ControlPlane, args) -> int:
    """The cluster alone: the children the operator would render, applied with the operator's
    own client code from 8 threads, then polled until every Deployment is Available."""
    from heteroserve_operator.api import InferenceDeploymentSpec
    from heteroserve_operator.kube import KubeApi
    from heteroserve_operator.reconcile import cluster_facts
    from heteroserve_operator.render.children import render
    from heteroserve_operator.render.meta import Owner

    api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
    kube = KubeApi(api)
    apps = k8s.AppsV1Api(api)
    facts = cluster_facts(kube.nodes(), kube.node_resource_topologies())
    owner_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    uid = k8s.CoreV1Api(api).create_namespaced_config_map("bench", owner_cm).metadata.uid
    wanted = 0
    manifests = []
    for index in range(args.objects):
        rendered = render(InferenceDeploymentSpec.model_validate(spec(index)),
                          Owner(f"infd-{index:04d}", "bench", uid), facts)
        for child in rendered.children:
            child["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap",
                                                     "name": "owner", "uid": uid}]
            manifests.append(child)
            wanted += child["kind"] == "Deployment"
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(kube.apply, manifests))
    applied_s = time.monotonic() - t0
    available = 0
    while time.monotonic() - t0 < args.timeout:
        items = apps.list_namespaced_deployment("bench", _request_timeout=60).items
        available = sum(1 for d in items if any(c.type == "Available" and c.status == "True"
                                                for c in (d.status.conditions or [])))
        if available >= wanted:
            break
        time.sleep(1)
    total_s = time.monotonic() - t0
    print("\n| measure (no operator) | value |\n|---|---|")
    print(f"| children applied ({len(manifests)} objects, 8 threads) | {applied_s:.1f} s |")
    print(f"| all {wanted} Deployments Available after | {total_s:.1f} s ({available} ready) |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--resync-seconds", type=float, default=30)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--baseline", action="store_true",
                        help="no operator: apply the same rendered children directly and time "
                        "the cluster alone until every Deployment is Available (the floor the "
                        "operator's figures sit on)")
    args = parser.parse_args()
    # A SIGTERM (timeout, pkill) unwinds through `finally`, which stops the cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix="heteroserve-bench-"))
    plane = ControlPlane(workdir / "cluster", log=lambda m: print(m, file=sys.stderr),
                         nodes=bench_nodes(args.nodes))
    started = time.monotonic()
    plane.start()
    print(f"cluster with {args.nodes} nodes up in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    operator = None
    try:
        plane.kubectl("apply", "--server-side", "-f",
                      str(REPO / "crds" / "heteroserve.io_inferencedeployments.yaml"))
        plane.kubectl("wait", "--for=condition=Established",
                      "crd/inferencedeployments.heteroserve.io")
        plane.kubectl("create", "namespace", "bench")
        if args.baseline:
            return baseline(plane, args)
        port = free_port()
        log = open(workdir / "operator.log", "wb")  # noqa: SIM115
        operator = subprocess.Popen(
            [sys.executable, "-m", "heteroserve_operator", "--metrics-port", str(port),
             "--liveness", "", "--resync-seconds", str(args.resync_seconds)],
            env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)}, stdout=log,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                metric(port, "heteroserve_operator_reconciles_total")
                break
            except httpx.HTTPError:
                time.sleep(0.2)

        api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
        custom = k8s.CustomObjectsApi(api)
        created: dict[str, float] = {}
        ready: dict[str, float] = {}
        done = threading.Event()

        def poller():
            # A LIST per second rather than a watch: a watch that drops under load would lose
            # Ready transitions. Resolution: about one second.
            while not done.is_set():
                try:
                    items = custom.list_namespaced_custom_object(
                        GROUP, VERSION, "bench", PLURAL, _request_timeout=30)["items"]
                except Exception as error:  # keep polling through apiserver hiccups
                    print(f"poll failed: {error}", file=sys.stderr)
                    time.sleep(1)
                    continue
                now = time.monotonic()
                for obj in items:
                    name = obj["metadata"]["name"]
                    conditions = obj.get("status", {}).get("conditions", [])
                    if name not in ready and any(c["type"] == "Ready" and c["status"] == "True"
                                                 for c in conditions):
                        ready[name] = now
                if len(ready) >= args.objects:
                    done.set()
                time.sleep(1)

        threading.Thread(target=poller, daemon=True).start()

        def create(index: int) -> None:
            name = f"infd-{index:04d}"
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, "bench", PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
                "metadata": {"name": name}, "spec": spec(index)})

        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(args.objects)))
        create_s = time.monotonic() - t0
        if not done.wait(args.timeout):
            print(f"only {len(ready)}/{args.objects} Ready after {args.timeout} s",
                  file=sys.stderr)
        converge_s = time.monotonic() - t0
        writes_converged = metric(port, "heteroserve_operator_api_writes_total")
        reconciles_converged = metric(port, "heteroserve_operator_reconciles_total")
        # Let trailing events settle, then measure a quiet period that includes resyncs.
        time.sleep(10)
        writes_before_idle = metric(port, "heteroserve_operator_api_writes_total")
        time.sleep(args.idle_seconds)
        writes_idle = metric(port, "heteroserve_operator_api_writes_total") - writes_before_idle
        reconciles_idle = metric(port, "heteroserve_operator_reconciles_total") - \
            reconciles_converged
        latencies = sorted(ready[n] - created[n] for n in ready)
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        rows = [
            ("InferenceDeployments / fake nodes", f"{args.objects} / {args.nodes}"),
            ("Ready", f"{len(ready)}/{args.objects}"),
            ("create calls took", f"{create_s:.1f} s"),
            ("all Ready after", f"{converge_s:.1f} s"),
            ("time to Ready p50", f"{statistics.median(latencies):.1f} s"),
            ("time to Ready p99", f"{p99:.1f} s"),
            ("API writes per object (converging)", f"{writes_converged / args.objects:.2f}"),
            ("reconciles per object (converging)", f"{reconciles_converged / args.objects:.2f}"),
            (f"API writes while idle ({args.idle_seconds:.0f} s, resync "
             f"{args.resync_seconds:.0f} s)", f"{writes_idle:.0f}"),
            ("reconciles while idle", f"{reconciles_idle:.0f}"),
            ("operator peak RSS", f"{rss_peak_mb(operator.pid):.0f} MB"),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"\n| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
        for label, value in rows:
            print(f"| {label:<{width}} | {value} |")
        print(json.dumps(dict(rows)), file=sys.stderr)
    finally:
        if operator:
            operator.terminate()
            operator.wait(timeout=30)
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
