"""Status tells the truth about pods that do not run: refused by Pod Security, unschedulable, or
starved of a node's cores by another InferenceDeployment; and it clears when the cause goes.
kwok runs the pods, the real kube-scheduler and admission judge them."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from prometheus_client import CollectorRegistry

from heteroserve_operator.kube import KubeApi
from heteroserve_operator.reconcile import Reconciler
from tests.integration.conftest import SAMPLES, condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.integration

SMOLLM2 = yaml.safe_load((SAMPLES / "builtin-smollm2-cpu.yaml").read_text())
# x86-cpu-0 in tests/cluster/nodes.yaml: 64 CPUs, two NUMA nodes of 32. A decode pod of 40 CPUs
# (20 per NUMA node) plus its router sidecar fits once, not twice.
NODE, NODE_CPUS, CPUS = "x86-cpu-0", 64, 40


def apply(cluster, namespace: str, document: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(document))


def smollm2(name: str, **decode) -> dict:
    document = copy.deepcopy(SMOLLM2)
    document["metadata"]["name"] = name
    document["spec"]["decode"].update(decode)
    return document


def conditions_when(cluster, namespace: str, name: str, what: str, timeout: float = 60,
                    **expected: tuple[str, str]) -> dict[str, dict]:
    """Waits until each condition type has (status, reason) as `expected`, for the current
    generation; returns the conditions read back from the apiserver."""
    def check():
        obj = get_json(cluster, "inferencedeployment", name, "-n", namespace)
        if obj.get("status", {}).get("observedGeneration") != obj["metadata"]["generation"]:
            return None
        found = {kind: condition(obj, kind) for kind in expected}
        if all(c and (c["status"], c["reason"]) == want
               for c, want in zip(found.values(), expected.values(), strict=True)):
            return found
        return None

    return wait_for(check, timeout, what=f"{namespace}/{name}: {what}")


def test_pods_refused_by_pod_security_degrade_with_the_admission_message(
        cluster, operator, namespace):
    # sysInfer's model is a hostPath volume, which Pod Security "baseline" forbids.
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=baseline")
    document = yaml.safe_load((SAMPLES / "sysinfer-baichuan2-13b.yaml").read_text())
    name = document["metadata"]["name"]
    apply(cluster, namespace, document)
    found = conditions_when(cluster, namespace, name, "Degraded for refused pods",
                            Degraded=("True", "PodsRefused"), DecodeReady=("False", "PodsRefused"),
                            Ready=("False", "PodsRefused"))
    message = found["Degraded"]["message"]
    assert message.startswith(f"decode: FailedCreate: pods \"{name}-decode-")
    assert 'violates PodSecurity "baseline:latest"' in message and "hostPath volumes" in message
    assert message in found["DecodeReady"]["message"]
    assert found["DecodeReady"]["message"].startswith("0/1 pods ready: ")
    events = get_json(cluster, "events", "-n", namespace,
                      "--field-selector", f"involvedObject.name={name}")["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "PodsRefused" for e in events)

    # The namespace admits the pods once it allows privileged ones; the ReplicaSet controller
    # retries with back-off and the status clears without anyone touching the deployment.
    cluster.kubectl("label", "--overwrite", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=privileged")
    found = conditions_when(cluster, namespace, name, "Degraded to clear", timeout=180,
                            Degraded=("False", "AsExpected"), Ready=("True", "Ready"))
    assert found["Degraded"]["message"] == ""


def test_unschedulable_pod_degrades_with_the_schedulers_message_and_clears(
        cluster, operator, namespace):
    # No node of the catalogue has 4 TiB of memory; the NUMA plan (CPUs only) still holds.
    apply(cluster, namespace, smollm2("too-much-memory", memory="4Ti"))
    found = conditions_when(cluster, namespace, "too-much-memory", "Degraded for Pending pods",
                            Degraded=("True", "PodsUnschedulable"),
                            DecodeReady=("False", "PodsUnschedulable"))
    message = found["Degraded"]["message"]
    assert message.startswith("decode pod too-much-memory-decode-")
    assert "nodes are available" in message and "Insufficient memory" in message
    cluster.kubectl("patch", "inferencedeployment", "too-much-memory", "-n", namespace,
                    "--type=merge", "-p", json.dumps({"spec": {"decode": {"memory": "2Gi"}}}))
    wait_ready(cluster, namespace, "too-much-memory")
    found = conditions_when(cluster, namespace, "too-much-memory", "Degraded to clear",
                            Degraded=("False", "AsExpected"),
                            DecodeReady=("True", "Available"))


def test_two_deployments_competing_for_one_nodes_cores_name_the_starved_one(
        cluster, operator, namespace):
    node = get_json(cluster, "node", NODE)
    assert node["status"]["allocatable"]["cpu"] == str(NODE_CPUS)
    assert CPUS < NODE_CPUS < 2 * CPUS
    pinned = {"cpus": CPUS, "numaNodes": 2, "nodeSelector": {"kubernetes.io/hostname": NODE}}
    apply(cluster, namespace, smollm2("first", **pinned))
    wait_ready(cluster, namespace, "first")
    apply(cluster, namespace, smollm2("second", **pinned))
    starved = conditions_when(cluster, namespace, "second", "the second to be starved",
                              Degraded=("True", "PodsUnschedulable"),
                              DecodeReady=("False", "PodsUnschedulable"),
                              Ready=("False", "PodsUnschedulable"))
    assert starved["Degraded"]["message"].startswith("decode pod second-decode-")
    assert "Insufficient cpu" in starved["Degraded"]["message"]
    assert "0/1 pods ready" in starved["DecodeReady"]["message"]
    # While the cause lasts (the scheduler keeps retrying), reconciles write nothing.
    registry = CollectorRegistry()
    reconciler = Reconciler(KubeApi(cluster.api_client(), registry), registry)
    for _ in range(20):
        outcome = reconciler.reconcile_by_name(namespace, "second")
        assert outcome.error is None and not outcome.status_written and outcome.applied == ()
    assert registry.get_sample_value("heteroserve_operator_api_writes_total") is None
    # The one holding the cores serves and is not degraded.
    first = get_json(cluster, "inferencedeployment", "first", "-n", namespace)
    assert condition(first, "Ready")["status"] == "True"
    assert (condition(first, "Degraded")["status"], condition(first, "Degraded")["reason"]) \
        == ("False", "AsExpected")
    # The cores come free: the scheduler places the waiting pod and the status clears.
    cluster.kubectl("delete", "inferencedeployment", "first", "-n", namespace)
    wait_ready(cluster, namespace, "second", timeout=120)
    conditions_when(cluster, namespace, "second", "Degraded to clear",
                    Degraded=("False", "AsExpected"))
