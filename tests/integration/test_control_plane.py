"""The test control plane itself: real apiserver, controller-manager, scheduler, kwok."""

from __future__ import annotations

import json

import pytest
import yaml
from prometheus_client import CollectorRegistry

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.api.models import DNS_LABEL_MAX, MAX_NAME_LENGTH
from heteroserve_operator.kube import KubeApi
from heteroserve_operator.numa import NumaPlanError
from heteroserve_operator.reconcile import Reconciler, cluster_facts
from heteroserve_operator.render import kv_token
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import Owner
from tests.cluster.catalogue import NRT_GROUP, NRT_PLURAL, NRT_VERSION, load_catalogue
from tests.fixtures.invalid_specs import (
    BASE,
    CPU_ONLY,
    INVALID_NAMES,
    INVALID_SPECS,
    LONGEST_NAME,
    VALID_SPECS,
)
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.harness.heteroserve.io}
spec:
  group: harness.heteroserve.io
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              required: [size]
              properties:
                size: {type: integer, minimum: 1}
"""


def test_apply_a_crd_and_an_object_of_it(cluster, namespace):
    cluster.kubectl("apply", "-f", "-", stdin=WIDGET_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "crd/widgets.harness.heteroserve.io")
    widget = {"apiVersion": "harness.heteroserve.io/v1", "kind": "Widget",
              "metadata": {"name": "w1", "namespace": namespace}, "spec": {"size": 3}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(widget))
    back = json.loads(cluster.kubectl("get", "widget", "w1", "-n", namespace, "-o", "json").stdout)
    assert back["spec"] == {"size": 3}
    # The structural schema is enforced by the real apiserver.
    widget["metadata"]["name"], widget["spec"]["size"] = "w2", 0
    refused = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(widget), check=False)
    assert refused.returncode != 0
    assert "spec.size" in refused.stderr
    assert "should be greater than or equal to 1" in refused.stderr


def test_deployment_on_a_fake_gpu_node_becomes_available(cluster, namespace):
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "gpu-app", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "gpu-app"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-app"}},
                "spec": {"containers": [{
                    "name": "main", "image": "registry.invalid/gpu-app:1",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }]},
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    cluster.kubectl("wait", "--for=condition=Available", "--timeout=90s",
                    "deployment/gpu-app", "-n", namespace)
    pods = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=gpu-app",
                                      "-o", "json").stdout)["items"]
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        # Only the Kunpeng server has NVIDIA GPUs in the catalogue.
        assert pod["spec"]["nodeName"] == "kunpeng-a100-0"


def test_a_running_pod_marked_not_ready_becomes_ready_again(cluster, namespace):
    """What the node lifecycle controller does to the pods of a node whose lease looks stale, and
    what the kubelet undoes once the node reports again (kwok-stage-pod-ready-again.yaml)."""
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "app"}},
                 "template": {"metadata": {"labels": {"app": "app"}},
                              "spec": {"containers": [{"name": "main",
                                                       "image": "registry.invalid/app:1"}]}}},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(deployment))
    cluster.kubectl("wait", "--for=condition=Available", "--timeout=90s", "deployment/app",
                    "-n", namespace)

    def pod():
        return json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", "app=app",
                                          "-o", "json").stdout)["items"][0]

    def ready(p):
        return next(c["status"] for c in p["status"]["conditions"] if c["type"] == "Ready")

    before = pod()
    name = before["metadata"]["name"]
    cluster.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status",
                    "--type=strategic", "-p", json.dumps({"status": {"conditions": [{
                        "type": "Ready", "status": "False", "reason": "NodeNotReady"}]}}))
    wait_for(lambda: ready(pod()) == "True", 60, what=f"pod {name} to be Ready again")
    after = pod()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    # No restart: the container keeps its start time.
    assert [c["state"] for c in after["status"]["containerStatuses"]] == \
        [c["state"] for c in before["status"]["containerStatuses"]]
    assert {c["type"] for c in after["status"]["conditions"]} >= {
        "Initialized", "Ready", "ContainersReady", "PodScheduled"}
    wait_for(lambda: json.loads(cluster.kubectl(
        "get", "deployment", "app", "-n", namespace, "-o", "json").stdout
    )["status"].get("readyReplicas") == 1, 60, what="the Deployment to count the pod ready")


def test_unschedulable_accelerator_request_stays_pending(cluster, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "too-many-gpus", "namespace": namespace},
           "spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "9"}}}]}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))

    def unschedulable():
        got = json.loads(cluster.kubectl("get", "pod", "too-many-gpus", "-n", namespace,
                                         "-o", "json").stdout)
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in got["status"].get("conditions", []))

    wait_for(unschedulable, what="the scheduler to mark the pod Unschedulable")


def test_deleting_an_owner_garbage_collects_its_children(cluster, namespace):
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = json.loads(cluster.kubectl("get", "configmap", "owner", "-n", namespace,
                                       "-o", "json").stdout)
    child = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "child", "namespace": namespace, "ownerReferences": [{
                 "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                 "uid": owner["metadata"]["uid"]}]}}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(child))
    cluster.kubectl("create", "deployment", "web", "--image=registry.invalid/web:1",
                    "-n", namespace)
    cluster.kubectl("wait", "--for=condition=Available", "--timeout=90s", "deployment/web",
                    "-n", namespace)

    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    cluster.kubectl("delete", "deployment", "web", "-n", namespace, "--cascade=background")

    def gone(*args):
        return lambda: cluster.kubectl("get", *args, "-n", namespace, "-o", "name",
                                       check=False).stdout.strip() == ""

    wait_for(gone("configmap", "child"), what="the garbage collector to delete the child")
    wait_for(gone("replicasets,pods", "-l", "app=web"),
             what="the Deployment's ReplicaSet and Pods to be collected")


def test_node_resource_topology_reads_back_with_the_numa_layout(cluster):
    client = cluster.api_client()
    from kubernetes import client as k8s

    custom = k8s.CustomObjectsApi(client)
    for node in load_catalogue():
        nrt = custom.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, node.name)
        zones = nrt["zones"]
        assert len(zones) == len(node.numa)
        assert [z["type"] for z in zones] == ["Node"] * len(zones)
    kunpeng = custom.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                               "kunpeng-a100-0")
    assert [z["name"] for z in kunpeng["zones"]] == ["node-0", "node-1", "node-2", "node-3"]
    cpus = [next(r for r in z["resources"] if r["name"] == "cpu")["capacity"]
            for z in kunpeng["zones"]]
    assert cpus == ["40", "40", "40", "40"]
    cpu_ids = [next(a for a in z["attributes"] if a["name"] == "cpus")["value"]
               for z in kunpeng["zones"]]
    assert cpu_ids == ["0-39", "40-79", "80-119", "120-159"]
    gpus = [next(r for r in z["resources"] if r["name"] == "nvidia.com/gpu")["capacity"]
            for z in kunpeng["zones"]]
    assert gpus == ["2", "2", "2", "2"]
    sysinfer = custom.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL,
                                                "kunpeng-cpu-0")
    assert len(sysinfer["zones"]) == 4
    assert {a["name"]: a["value"] for a in sysinfer["attributes"]}["topologyManagerPolicy"] \
        == "single-numa-node"


def test_fake_nodes_carry_the_seed_capacity_and_labels(cluster):
    nodes = {n["metadata"]["name"]: n for n in json.loads(
        cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]}
    kunpeng = nodes["kunpeng-a100-0"]
    assert kunpeng["status"]["capacity"]["cpu"] == "160"
    assert kunpeng["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert kunpeng["metadata"]["labels"]["kubernetes.io/arch"] == "arm64"
    assert kunpeng["metadata"]["labels"]["heteroserve.io/numa-nodes"] == "4"
    assert kunpeng["metadata"]["labels"]["heteroserve.io/cpus-per-numa-node"] == "40"
    gaudi = nodes["gaudi2-0"]["status"]["capacity"]
    assert gaudi["habana.ai/gaudi"] == "8"
    assert gaudi["hugepages-2Mi"] == "30000Mi"  # vm.nr_hugepages=15000 (seed 003)
    assert nodes["ascend-910-0"]["status"]["capacity"]["huawei.com/Ascend910"] == "8"
    assert nodes["kunpeng-cpu-0"]["status"]["capacity"]["cpu"] == "256"
    for node in nodes.values():
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"


def test_rbac_is_enforced(cluster, namespace):
    """The apiserver runs with RBAC: a service account without bindings is refused."""
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    answer = cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace,
                             f"--as=system:serviceaccount:{namespace}:nobody", check=False)
    assert answer.stdout.strip() == "no"
    cluster.kubectl("create", "rolebinding", "view", "--clusterrole=view",
                    f"--serviceaccount={namespace}:nobody", "-n", namespace)
    answer = cluster.kubectl("auth", "can-i", "list", "pods", "-n", namespace,
                             f"--as=system:serviceaccount:{namespace}:nobody", check=False)
    assert answer.stdout.strip() == "yes"


def test_kubeconfig_is_usable_by_the_python_client(cluster):
    from kubernetes import client as k8s

    version = k8s.VersionApi(cluster.api_client()).get_code()
    assert version.git_version.startswith("v1.36.")
    assert yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"][
        "server"].startswith("https://127.0.0.1:")


# -- admission rules of the InferenceDeployment CRD (api/models.py) -------------------------------
def _document(name: str, namespace: str, spec: dict) -> str:
    return json.dumps({"apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment",
                       "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def _rendered_children(name: str, namespace: str) -> list[dict]:
    catalogue = load_catalogue()
    facts = cluster_facts([n.node_manifest() for n in catalogue],
                          [n.topology_manifest() for n in catalogue])
    # builtin prefill + builtin decode: every child kind, the KV token Secret included.
    spec = InferenceDeploymentSpec.model_validate({
        **BASE, "prefill": {"accelerator": {"type": "nvidia", "count": 1},
                            "engine": {"kind": "builtin"}, "replicas": 2},
        "decode": {"cpus": 8, "replicas": 2},
        "ingress": {"enabled": True, "host": "llm.example.com"}})
    owner = Owner(name, namespace, "00000000-0000-0000-0000-000000000001")
    rendered = render(spec, owner, facts)
    assert rendered.kv_token_secret is not None
    return [*rendered.children, kv_token.secret(owner, "x")]


def _server_dry_run(cluster, manifests: list[dict]) -> dict[str, str]:
    """kind/name -> the apiserver's refusal, for each manifest it refuses."""
    refused = {}
    for manifest in manifests:
        result = cluster.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-",
                                 stdin=json.dumps(manifest), check=False)
        if result.returncode != 0:
            refused[f"{manifest['kind']}/{manifest['metadata']['name']}"] = result.stderr
    return refused


def test_names_the_children_cannot_carry_are_refused_at_admission(cluster, crd_installed,
                                                                   namespace):
    for name, message in INVALID_NAMES:
        refused = cluster.kubectl("create", "-f", "-", stdin=_document(name, namespace, BASE),
                                  check=False)
        assert refused.returncode != 0, name
        assert message in refused.stderr, (name, refused.stderr)
        assert cluster.kubectl("get", "inferencedeployment", name, "-n", namespace,
                               check=False).returncode != 0
    # The longest name the rule admits is accepted, and the apiserver takes every child the
    # operator renders for it.
    cluster.kubectl("create", "-f", "-", stdin=_document(LONGEST_NAME, namespace, BASE))
    # An operator running for other tests may have made its children already: remove them
    # (foreground: the call returns once they are gone), then offer them to the apiserver.
    cluster.kubectl("delete", "inferencedeployment", LONGEST_NAME, "-n", namespace,
                    "--cascade=foreground", "--wait=true", "--timeout=60s")
    assert _server_dry_run(cluster, _rendered_children(LONGEST_NAME, namespace)) == {}
    # Without the rule, a longer name would be stored and its decode Service refused at apply.
    too_long = LONGEST_NAME + "x" * (DNS_LABEL_MAX - len("-decode") - MAX_NAME_LENGTH + 1)
    refused = _server_dry_run(cluster, _rendered_children(too_long, namespace))
    assert list(refused) == [f"Service/{too_long}-decode"]
    assert "must be no more than 63 characters" in refused[f"Service/{too_long}-decode"]
    dotted = _server_dry_run(cluster, _rendered_children("my.model", namespace))
    assert {"Service/my.model", "Service/my.model-decode"} <= set(dotted)


@pytest.mark.parametrize(("name", "spec"), VALID_SPECS, ids=[n for n, _s in VALID_SPECS])
def test_specs_at_the_edge_of_the_rules_are_accepted(cluster, crd_installed, namespace, name,
                                                     spec):
    cluster.kubectl("create", "-f", "-", stdin=_document(name, namespace, spec))
    stored = json.loads(cluster.kubectl("get", "inferencedeployment", name, "-n", namespace,
                                        "-o", "json").stdout)
    assert InferenceDeploymentSpec.model_validate(stored["spec"]) == \
        InferenceDeploymentSpec.model_validate(spec)


def test_a_fractional_memory_is_no_drift(cluster, crd_installed, namespace):
    """`1.5Gi` comes back from the apiserver as `1536Mi`; the reconciler must not re-apply it."""
    spec = {**CPU_ONLY, "decode": {"cpus": 2, "memory": "1.5Gi"}}
    cluster.kubectl("create", "-f", "-", stdin=_document("fractional", namespace, spec))
    registry = CollectorRegistry()
    reconciler = Reconciler(KubeApi(cluster.api_client(), registry), registry)
    # An operator running for other tests may apply the children first: either way they exist
    # after this reconcile, and what matters is that reconciling again applies nothing.
    first = reconciler.reconcile_by_name(namespace, "fractional")
    assert first.error is None
    live = json.loads(cluster.kubectl("get", "deployment", "fractional-decode", "-n", namespace,
                                      "-o", "json").stdout)
    engine = live["spec"]["template"]["spec"]["containers"][0]
    assert engine["resources"]["limits"]["memory"] == "1536Mi"  # stored canonical
    for _ in range(3):
        again = reconciler.reconcile_by_name(namespace, "fractional")
        assert again.error is None and again.applied == () and again.pruned == ()
    assert (registry.get_sample_value("heteroserve_operator_api_writes_total",
                                      {"verb": "apply", "kind": "Deployment"}) or 0) <= 1


def test_updates_are_held_to_the_rules_and_never_touch_immutable_fields(cluster, crd_installed,
                                                                        namespace):
    """The CEL rules judge updates as they judge creates (a refused update leaves the stored
    object and its generation as they were), and no spec update makes the operator ask the
    apiserver to change an immutable field of a child: Deployment selectors, and the KV token
    Secret, which is immutable as a whole."""
    cluster.kubectl("create", "-f", "-", stdin=_document("upd", namespace, BASE))
    stored = json.loads(cluster.kubectl("get", "inferencedeployment", "upd", "-n", namespace,
                                        "-o", "json").stdout)
    for name, spec, message in INVALID_SPECS:
        for _ in range(10):
            refused = cluster.kubectl("replace", "-f", "-",
                                      stdin=_document("upd", namespace, spec), check=False)
            # An operator running for other tests may write the status between kubectl's read
            # and its update (an optimistic-lock conflict, not the rule): try again.
            if "the object has been modified" not in refused.stderr:
                break
        assert refused.returncode != 0, name
        assert message in refused.stderr, (name, refused.stderr)
    after = json.loads(cluster.kubectl("get", "inferencedeployment", "upd", "-n", namespace,
                                       "-o", "json").stdout)
    assert after["spec"] == stored["spec"]
    assert after["metadata"]["generation"] == stored["metadata"]["generation"] == 1

    # The children of the stored spec, applied as the operator applies them; then every valid
    # spec's children as updates of those (server-side dry run).
    catalogue = load_catalogue()
    facts = cluster_facts([n.node_manifest() for n in catalogue],
                          [n.topology_manifest() for n in catalogue])
    owner = Owner("upd", namespace, stored["metadata"]["uid"])
    first = render(InferenceDeploymentSpec.model_validate(BASE), owner, facts)
    for child in first.children:
        cluster.kubectl("apply", "--server-side", "--field-manager=heteroserve-operator",
                        "-f", "-", stdin=json.dumps(child))
    updated = 0
    for name, spec in [("base", BASE), *VALID_SPECS]:
        try:
            rendered = render(InferenceDeploymentSpec.model_validate(spec), owner, facts)
        except NumaPlanError:
            continue  # nothing to apply: the status says why
        updated += 1
        present = {(c["kind"], c["metadata"]["name"]) for c in first.children}
        for child in rendered.children:
            if (child["kind"], child["metadata"]["name"]) not in present:
                continue
            result = cluster.kubectl("apply", "--server-side", "--dry-run=server",
                                     "--force-conflicts", "--field-manager=heteroserve-operator",
                                     "-f", "-", stdin=json.dumps(child), check=False)
            assert result.returncode == 0, (name, child["kind"], result.stderr)
    assert updated >= len(VALID_SPECS) // 2

    # The KV token Secret: created once, never changed; the apiserver refuses a change.
    # (An operator running for other tests may have made it already, as it does.)
    made = cluster.kubectl("create", "-f", "-", stdin=json.dumps(kv_token.secret(owner, "first")),
                           check=False)
    assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
    secret_name = kv_token.secret_name(owner)
    changed = cluster.kubectl("patch", "secret", secret_name, "-n", namespace, "--type=merge",
                              "-p", json.dumps({"stringData": {"token": "second"}}),
                              check=False)
    assert changed.returncode != 0 and "field is immutable" in changed.stderr
