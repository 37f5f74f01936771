"""The operator's API writes: client CPU per server-side apply (a script, not a test).

    .venv/bin/python -m tests.bench.kube_request_cpu [--objects 200 --rounds 3]

Starts its own test control plane, renders the benchmark's InferenceDeployments
(tests/bench/operator_scale.py) and applies their ConfigMaps and Deployments, alternately in two
namespaces, through
- `KubeApi.apply` (the operator's path: the client's connection pool, orjson-encoded bodies), and
- the kubernetes client's own ApiClient path (`param_serialize` + `call_api`, its sanitising
  walk of the body and standard-library JSON), the way KubeApi sent them before,
with the same connection pool and auth. Printed: the median over rounds of the process's CPU
milliseconds per apply for each path (the apiserver's time is not counted), and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from kubernetes import config as k8s_config
from prometheus_client import CollectorRegistry

from tests.bench.operator_scale import bench_nodes, name_of, spec
from tests.cluster.harness import ControlPlane, ensure_binaries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from heteroserve_operator.api.models import InferenceDeploymentSpec
    from heteroserve_operator.kube import KINDS, KubeApi
    from heteroserve_operator.reconcile import cluster_facts
    from heteroserve_operator.render.children import render
    from heteroserve_operator.render.meta import FIELD_MANAGER, Owner

    ensure_binaries()
    plane = ControlPlane(Path(tempfile.mkdtemp(prefix="heteroserve-bench-")) / "cluster",
                         log=lambda m: print(m, file=sys.stderr), nodes=bench_nodes(10))
    plane.start()
    try:
        kube = KubeApi(k8s_config.new_client_from_config(config_file=str(plane.kubeconfig)),
                       CollectorRegistry())
        facts = cluster_facts(kube.nodes(), kube.node_resource_topologies())

        def manifests(namespace: str) -> list[dict]:
            out = []
            for index in range(args.objects):
                rendered = render(InferenceDeploymentSpec.model_validate(spec(index)),
                                  Owner(name_of(index), namespace, "uid"), facts)
                for child in rendered.children:
                    child["metadata"].pop("ownerReferences", None)   # no owner object here
                    if child["kind"] in ("ConfigMap", "Deployment"):
                        out.append(child)
            return out

        def client_path(manifest: dict) -> None:
            """What KubeApi.request did before: kubernetes' ApiClient end to end."""
            kind = KINDS[(manifest["apiVersion"], manifest["kind"])]
            meta = manifest["metadata"]
            params = kube.api.param_serialize(
                method="PATCH", resource_path=f"{kind.collection(meta['namespace'])}/"
                f"{quote(meta['name'])}", path_params={},
                query_params=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                header_params={"Accept": "application/json",
                               "Content-Type": "application/apply-patch+yaml"},
                body=manifest, post_params=[], files={}, auth_settings=["BearerToken"],
                collection_formats={}, _host=None, _request_auth=None)
            response = kube.api.call_api(*params, _request_timeout=60)
            response.read()
            assert response.status < 400, response.data[:300]
            json.loads(response.data)

        paths = {"KubeApi.apply (pool + orjson)": kube.apply,
                 "kubernetes ApiClient (param_serialize + call_api)": client_path}
        cpu: dict[str, list[float]] = {label: [] for label in paths}
        for namespace in ("a", "b"):
            plane.kubectl("create", "namespace", namespace)
        for _ in range(args.rounds):
            for (label, send), namespace in zip(paths.items(), ("a", "b"), strict=True):
                batch = manifests(namespace)
                started = time.process_time()
                for manifest in batch:
                    send(manifest)
                cpu[label].append((time.process_time() - started) / len(batch) * 1000)
            paths = dict(reversed(list(paths.items())))   # alternate which path goes first
    finally:
        plane.stop()
    print(f"\n{args.objects} InferenceDeployments' ConfigMaps and Deployments, server-side "
          f"applied, {args.rounds} rounds; {os.cpu_count()} CPUs\n")
    print("| path | client CPU ms per apply, median | rounds |")
    print("|---|---|---|")
    for label, values in cpu.items():
        print(f"| {label} | {statistics.median(values):.3f} | "
              + ", ".join(f"{v:.3f}" for v in values) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
