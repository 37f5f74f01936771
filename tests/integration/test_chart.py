"""The Helm chart: lints, installs with real helm, admits the operator pod under Pod Security
"restricted", and its RBAC is enough for the operator to do its whole job (and no more)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.cluster.harness import BIN
from tests.integration.conftest import REPO, SAMPLES, OperatorProcess, get_json, wait_ready

pytestmark = pytest.mark.integration

CHART = REPO / "charts" / "heteroserve"
RELEASE, SYSTEM_NS = "hs", "heteroserve-system"
SA = f"{RELEASE}-operator"


def helm(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "helm"), *args, f"--kubeconfig={cluster.kubeconfig}"],
                          capture_output=True, text=True, check=True, timeout=120)


def restricted_namespace(cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name, check=False)
    cluster.kubectl("label", "namespace", name, "--overwrite",
                    "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")


@pytest.fixture(scope="module")
def installed_chart(cluster, crd_installed):
    subprocess.run([str(BIN / "helm"), "lint", "--strict", str(CHART)], check=True,
                   capture_output=True, text=True)
    restricted_namespace(cluster, SYSTEM_NS)
    helm(cluster, "upgrade", "--install", RELEASE, str(CHART), "-n", SYSTEM_NS, "--wait",
         "--timeout=120s")
    yield
    helm(cluster, "uninstall", RELEASE, "-n", SYSTEM_NS)


def test_operator_pod_is_admitted_under_restricted_pod_security(cluster, installed_chart):
    deployment = get_json(cluster, "deployment", SA, "-n", SYSTEM_NS)
    assert deployment["status"]["availableReplicas"] == 1
    (pod,) = get_json(cluster, "pods", "-n", SYSTEM_NS, "-l",
                      "app.kubernetes.io/name=heteroserve-operator")["items"]
    assert pod["status"]["phase"] == "Running"
    assert pod["spec"]["serviceAccountName"] == SA


def test_rbac_is_least_privilege(cluster, installed_chart):
    def can(verb, resource, *extra):
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-n", "default", *extra,
                                 f"--as=system:serviceaccount:{SYSTEM_NS}:{SA}", check=False)
        return answer.stdout.strip() == "yes"

    assert can("patch", "inferencedeployments.heteroserve.io", "--subresource=status")
    assert can("create", "deployments.apps") and can("delete", "configmaps")
    assert can("list", "noderesourcetopologies.topology.node.k8s.io")
    assert not can("get", "secrets")
    assert can("patch", "replicasets.apps")  # only to release a held rollout (rollout.py)
    assert not can("create", "replicasets.apps") and not can("delete", "replicasets.apps")
    assert not can("create", "pods", "--subresource=exec")
    assert not can("patch", "inferencedeployments.heteroserve.io")  # only its status
    assert not can("delete", "nodes")
    assert not can("create", "clusterrolebindings.rbac.authorization.k8s.io")


def test_operator_with_the_chart_rbac_serves_a_sample_in_a_restricted_namespace(
        cluster, installed_chart, operator, tmp_path):
    token = cluster.kubectl("create", "token", SA, "-n", SYSTEM_NS, "--duration=1h"
                            ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": admin["clusters"],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"],
                                                "user": "sa"}}]}))
    kubeconfig.chmod(0o600)
    namespace = "restricted-serving"
    restricted_namespace(cluster, namespace)
    operator.stop()  # the admin-run operator steps aside while the chart's identity works
    scoped = OperatorProcess(kubeconfig, tmp_path)
    scoped.start()
    try:
        for sample in ("builtin-smollm2-cpu", "builtin-gpu-prefill-cpu-decode"):
            path = SAMPLES / f"{sample}.yaml"
            name = yaml.safe_load(path.read_text())["metadata"]["name"]
            cluster.kubectl("apply", "-n", namespace, "-f", str(path))
            wait_ready(cluster, namespace, name)
        # Nothing failed in this namespace: a refused write is a warning naming it, a reconcile
        # that raised an error naming it. (Not the process's error count: it also reconciles
        # other tests' namespaces, and one being deleted refuses writes.)
        problems = [line for line in scoped.log_path.read_text(errors="replace").splitlines()
                    if f"{namespace}/" in line or f'namespace "{namespace}"' in line
                    if " WARNING " in line or " ERROR " in line]
        assert problems == [], problems
    finally:
        scoped.stop()
        operator.start()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
