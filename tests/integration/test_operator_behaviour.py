"""Reconcile behaviour on the real control plane: CEL refusals, self-healing, roll-outs,
deletion, restarts and idleness."""

from __future__ import annotations

import base64
import json
import logging
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import CollectorRegistry

from heteroserve_operator.kube import KubeApi
from heteroserve_operator.reconcile import Reconciler
from heteroserve_operator.render.meta import FIELD_MANAGER
from tests.fixtures.invalid_specs import INVALID_SPECS
from tests.integration.conftest import SAMPLES, condition, get_json, wait_for, wait_ready

pytestmark = pytest.mark.integration

SAMPLE = SAMPLES / "builtin-gpu-prefill-cpu-decode.yaml"
NAME = "smollm2-pd"
CHILDREN = ("deployment/smollm2-pd-prefill", "deployment/smollm2-pd-decode",
            "service/smollm2-pd", "service/smollm2-pd-decode", "configmap/smollm2-pd-router",
            "poddisruptionbudget/smollm2-pd-decode")


def apply_sample(cluster, namespace: str) -> dict:
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    return wait_ready(cluster, namespace, NAME)


def resource_versions(cluster, namespace: str) -> dict[str, object]:
    """What the operator has written: the InferenceDeployment's resourceVersion (nothing else
    writes it here), and for each child its generation and the operator's managed-field entries
    (a server-side apply that changes nothing leaves them as they were). Not the children's
    resourceVersions: the controller-manager keeps writing Deployment and PDB status as pods
    come and go, which made the comparison flaky without the operator writing anything."""
    state: dict[str, object] = {}
    for ref in CHILDREN:
        meta = get_json(cluster, ref, "-n", namespace)["metadata"]
        owned = sorted((m.get("operation", ""), m.get("subresource", ""), m.get("time", ""))
                       for m in meta.get("managedFields", []) if m["manager"] == FIELD_MANAGER)
        state[ref] = (meta.get("generation"), tuple(owned))
    owner = f"inferencedeployment/{NAME}"
    state[owner] = get_json(cluster, owner, "-n", namespace)["metadata"]["resourceVersion"]
    return state


@pytest.mark.parametrize(("name", "spec", "message"), INVALID_SPECS,
                         ids=[n for n, _s, _m in INVALID_SPECS])
def test_invalid_spec_is_refused_with_the_cel_message(cluster, crd_installed, namespace, name,
                                                      spec, message):
    document = {"apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    refused = cluster.kubectl("apply", "-f", "-", stdin=json.dumps(document), check=False)
    assert refused.returncode != 0
    assert message in refused.stderr
    assert cluster.kubectl("get", "inferencedeployment", name, "-n", namespace,
                           check=False).returncode != 0


def test_deleted_and_edited_children_are_restored(cluster, operator, namespace):
    apply_sample(cluster, namespace)
    before = get_json(cluster, "deployment", f"{NAME}-decode", "-n", namespace)
    cluster.kubectl("delete", "service", f"{NAME}-decode", "-n", namespace)
    cluster.kubectl("delete", "configmap", f"{NAME}-router", "-n", namespace)
    cluster.kubectl("patch", "deployment", f"{NAME}-decode", "-n", namespace, "--type=json",
                    "-p", json.dumps([
                        {"op": "replace", "path": "/spec/replicas", "value": 5},
                        {"op": "replace", "path": "/spec/template/spec/containers/0/env/0/value",
                         "value": "9"}]))
    wait_for(lambda: cluster.kubectl("get", "service", f"{NAME}-decode", "-n", namespace,
                                     check=False).returncode == 0,
             what="the decode Service to come back")
    wait_for(lambda: cluster.kubectl("get", "configmap", f"{NAME}-router", "-n", namespace,
                                     check=False).returncode == 0,
             what="the router ConfigMap to come back")

    def restored():
        now = get_json(cluster, "deployment", f"{NAME}-decode", "-n", namespace)
        return (now["spec"]["replicas"] == 2 and now["spec"]["template"]["spec"]["containers"][0]
                ["env"] == before["spec"]["template"]["spec"]["containers"][0]["env"])

    wait_for(restored, what="the hand edit of the decode Deployment to be reverted")
    wait_ready(cluster, namespace, NAME)


def test_endpoint_slice_watch_sees_the_router_services_slices_only(cluster, operator, namespace):
    """The operator's EndpointSlice watch selector, asked of the apiserver as the operator asks
    it: exactly the router Service's slices, whose ready endpoints RouterReady counts (the
    controller-manager copies a Service's labels onto its slices); not the headless decode
    Service's."""
    from heteroserve_operator.watches import SELECTORS

    apply_sample(cluster, namespace)
    selector = SELECTORS["EndpointSlice"]
    every = get_json(cluster, "endpointslices", "-n", namespace)["items"]
    assert {s["metadata"]["labels"]["kubernetes.io/service-name"] for s in every} == {
        NAME, f"{NAME}-decode"}
    watched = get_json(cluster, "endpointslices", "-n", namespace, "-l", selector)["items"]
    assert watched and {s["metadata"]["labels"]["kubernetes.io/service-name"]
                        for s in watched} == {NAME}


def test_spec_change_rolls_out(cluster, operator, namespace):
    apply_sample(cluster, namespace)
    cluster.kubectl("patch", "inferencedeployment", NAME, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"decode": {"cpus": 16, "quantization": "q4_0"}}}))
    obj = wait_ready(cluster, namespace, NAME)
    assert obj["status"]["observedGeneration"] == 2
    assert obj["status"]["numaPlans"][0]["cpus"] == "0-7,16-23"
    pods = get_json(cluster, "pods", "-n", namespace, "-l",
                    f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=decode")
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    wait_for(lambda: len([p for p in get_json(cluster, "pods", "-n", namespace, "-l",
                          f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=decode"
                          )["items"] if not p["metadata"].get("deletionTimestamp")]) == 2,
             what="the old decode pods to go")
    for pod in live:
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        if env["OMP_NUM_THREADS"] == "16":
            # the builtin engine: NRC only when gemvTiling is set
            assert env["SYSHAX_QUANTIZE"] == "q4_0" and "NRC" not in env
            assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "16"
    # Scaling the decode tier to one replica prunes its PodDisruptionBudget.
    cluster.kubectl("patch", "inferencedeployment", NAME, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"decode": {"replicas": 1}}}))
    wait_for(lambda: cluster.kubectl("get", "pdb", f"{NAME}-decode", "-n", namespace,
                                     check=False).returncode != 0,
             what="the decode PodDisruptionBudget to be pruned")


def test_deleting_the_inference_deployment_removes_every_child(cluster, operator, namespace):
    apply_sample(cluster, namespace)
    cluster.kubectl("delete", "inferencedeployment", NAME, "-n", namespace)

    def all_gone():
        listing = cluster.kubectl("get",
                                  "deployments,replicasets,pods,services,configmaps,pdb,secrets",
                                  "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}",
                                  "-o", "name").stdout.strip()
        return listing == ""

    wait_for(all_gone, timeout=90, what="the garbage collector to remove every child")


def test_impossible_numa_request_is_degraded_with_the_rule(cluster, operator, namespace):
    document = yaml.safe_load((SAMPLES / "syshax-ds-32b.yaml").read_text())
    document["metadata"]["name"] = "too-big"
    # 160 CPUs over 4 NUMA nodes of 40 with 4 reserved on each cannot be planned.
    document["spec"]["decode"]["reservedCpusPerNumaNode"] = 4
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=json.dumps(document))

    def degraded():
        obj = get_json(cluster, "inferencedeployment", "too-big", "-n", namespace)
        cond = condition(obj, "Degraded")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(degraded, what="the Degraded condition")
    assert cond["reason"] == "NumaPlanFailed"
    assert "needs 40 CPUs on each, but NUMA node 0 of kunpeng-a100-0 has 40 of which 4 are " \
           "reserved" in cond["message"]
    events = get_json(cluster, "events", "-n", namespace,
                      "--field-selector", "involvedObject.name=too-big")["items"]
    assert any(e["reason"] == "NumaPlanFailed" and e["type"] == "Warning" for e in events)
    assert cluster.kubectl("get", "deployment", "too-big-decode", "-n", namespace,
                           check=False).returncode != 0


def test_hundred_reconciles_of_an_unchanged_spec_make_no_writes(cluster, operator, namespace):
    apply_sample(cluster, namespace)
    wait_for(lambda: resource_versions(cluster, namespace) == resource_versions(
        cluster, namespace), what="the objects to settle")
    before = resource_versions(cluster, namespace)
    registry = CollectorRegistry()
    reconciler = Reconciler(KubeApi(cluster.api_client(), registry), registry)
    for _ in range(100):
        outcome = reconciler.reconcile_by_name(namespace, NAME)
        assert outcome.error is None
        assert outcome.applied == () and outcome.pruned == () and not outcome.status_written
    assert registry.get_sample_value("heteroserve_operator_api_writes_total") is None
    assert registry.get_sample_value("heteroserve_operator_reconciles_total",
                                     {"result": "ok"}) == 100
    assert resource_versions(cluster, namespace) == before


def test_reconciles_read_the_watch_caches_and_still_repair(cluster, operator, namespace,
                                                          monkeypatch):
    """The operator's informers (informer.py, watches.py) against the real apiserver: once
    they have listed, a reconcile of a settled object reads nothing from the API but the
    object itself (once; then kopf's events and its own writes keep it) and writes nothing; a
    child deleted by hand is known absent from its watch and applied again, without a read."""
    from heteroserve_operator.informer import ChildCaches
    from heteroserve_operator.watches import CHILD_WATCHES, child_event

    apply_sample(cluster, namespace)
    wait_for(lambda: resource_versions(cluster, namespace) == resource_versions(
        cluster, namespace), what="the objects to settle")
    # The operator process would repair the hand deletion below too, racing this reconciler.
    operator.stop()
    before = resource_versions(cluster, namespace)
    registry = CollectorRegistry()
    kube = KubeApi(cluster.api_client(), registry)
    reconciler = Reconciler(kube, registry)
    events: list[tuple[str, str, str]] = []
    queued: list[tuple[str, str]] = []
    handle = child_event(reconciler, SimpleNamespace(  # type: ignore[arg-type]
        add=lambda *key: queued.append(key)))

    def record(kind: str, obj: dict) -> None:
        handle(kind, obj)
        events.append((kind, obj["kind"], obj["metadata"]["name"]))

    caches = ChildCaches(kube, CHILD_WATCHES, {s.kind: record for s in CHILD_WATCHES},
                         (namespace,))
    caches.start()
    try:
        assert caches.wait_synced(30)
        listed = registry.get_sample_value("heteroserve_operator_api_reads_total",
                                           {"kind": "Deployment"})
        assert listed == 1   # the informer's LIST, nothing else yet
        reconciler.caches = caches
        import heteroserve_operator.reconcile as reconcile_module
        renders, render = [], reconcile_module.render
        monkeypatch.setattr(reconcile_module, "render",
                            lambda *a: renders.append(a) or render(*a))
        for _ in range(100):
            outcome = reconciler.reconcile_by_name(namespace, NAME)
            assert outcome.error is None and outcome.applied == () and not outcome.status_written
        reads = {kind: registry.get_sample_value("heteroserve_operator_api_reads_total",
                                                 {"kind": kind})
                 for kind in ("InferenceDeployment", "Deployment", "Pod", "EndpointSlice",
                              "ConfigMap", "Service", "PodDisruptionBudget", "Ingress")}
        # One LIST per informer (another only if a watch had to list again) and one GET of
        # the InferenceDeployment. The Services, ConfigMap and PDB (whose fields the
        # metadata-only caches do not hold) are read by the first reconcile, found as desired,
        # and again only after their watch saw them change (the controller-manager updates a
        # PDB's status as pods come and go): LIST + one GET per child + one per change seen,
        # against one read per reconcile (100) without the caches.
        assert reads["InferenceDeployment"] == 1
        assert all(reads[k] <= 2 for k in ("Deployment", "Pod", "EndpointSlice", "Ingress"))
        for kind, children in (("Service", 2), ("ConfigMap", 1), ("PodDisruptionBudget", 1)):
            changes = sum(1 for e in events if e[1] == kind and e[0] != "ADDED")
            assert 1 + children <= reads[kind] <= 2 + children + changes, (kind, events)
        assert registry.get_sample_value("heteroserve_operator_api_writes_total") is None
        assert resource_versions(cluster, namespace) == before
        # Rendered once: per generation, and again only when the cluster facts change.
        assert len(renders) == 1

        cluster.kubectl("delete", "configmap", f"{NAME}-router", "-n", namespace)
        wait_for(lambda: ("DELETED", "ConfigMap", f"{NAME}-router") in events,
                 what="the informer to see the deletion")
        configmap_reads = registry.get_sample_value("heteroserve_operator_api_reads_total",
                                                    {"kind": "ConfigMap"})
        outcome = reconciler.reconcile_by_name(namespace, NAME)
        assert outcome.applied == (f"ConfigMap/{NAME}-router",)
        assert registry.get_sample_value("heteroserve_operator_api_reads_total",
                                         {"kind": "ConfigMap"}) == configmap_reads
    finally:
        caches.stop()
        operator.start()


def rolled_out(cluster, namespace: str) -> bool:
    """Every child Deployment has every replica updated, ready and available for its current
    generation: the pod counts that the InferenceDeployment's status reports stop moving."""
    for ref in CHILDREN:
        if not ref.startswith("deployment/"):
            continue
        obj = get_json(cluster, ref, "-n", namespace)
        status, want = obj.get("status", {}), obj["spec"]["replicas"]
        if status.get("observedGeneration") != obj["metadata"]["generation"] or any(
                status.get(key, 0) != want for key in ("updatedReplicas", "readyReplicas",
                                                          "availableReplicas", "replicas")):
            return False
    return True


def test_restarting_the_operator_changes_nothing(cluster, operator, namespace):
    apply_sample(cluster, namespace)
    wait_for(lambda: rolled_out(cluster, namespace), what="the children to roll out")

    def status_caught_up() -> bool:
        # The running operator's last status write for the rolled-out pods, before the restart.
        status = get_json(cluster, "inferencedeployment", NAME, "-n", namespace)["status"]
        return all(status[tier]["readyReplicas"] == status[tier]["replicas"]
                   for tier in ("prefill", "decode"))

    wait_for(status_caught_up, what="the status to count every ready replica")

    def others() -> list[str]:
        items = json.loads(cluster.kubectl("get", "inferencedeployments", "-A", "-o", "json"
                                           ).stdout)["items"]
        return [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in items
                if i["metadata"]["namespace"] != namespace]

    # Other tests' namespaces are deleted without waiting: their deployments, no longer Ready
    # while their pods go, would be reconciled (and written to) by the restarted operator too.
    wait_for(lambda: not others(), 180, what="the other tests' deployments to be gone")
    before = resource_versions(cluster, namespace)
    operator.stop()
    operator.start()
    # The new process lists and reconciles every InferenceDeployment at start-up.
    wait_for(lambda: operator.metric("heteroserve_operator_reconciles_total", result="ok") >= 1,
             what="the restarted operator to reconcile")
    def live_objects() -> int:
        items = json.loads(cluster.kubectl("get", "inferencedeployments", "-A", "-o", "json"
                                           ).stdout)["items"]
        return len([i for i in items if not i["metadata"].get("deletionTimestamp")])

    wait_for(lambda: operator.metric("heteroserve_operator_reconciles_total") >= live_objects(),
             what="the restarted operator to reconcile every object")
    assert operator.metric("heteroserve_operator_api_writes_total") == 0
    assert resource_versions(cluster, namespace) == before


KV_SECRET = f"{NAME}-kv-token"


def kv_token(cluster, namespace: str) -> tuple[str, dict]:
    secret = get_json(cluster, "secret", KV_SECRET, "-n", namespace)
    return base64.b64decode(secret["data"]["token"]).decode(), secret


def mark_not_ready(cluster, namespace: str) -> None:
    """What the status says while pods cannot start (kwok starts pods without mounting their
    volumes, so a missing Secret cannot make them fail here)."""
    obj = get_json(cluster, "inferencedeployment", NAME, "-n", namespace)
    conditions = [{**c, "status": "False"} if c["type"] == "Ready" else c
                  for c in obj["status"]["conditions"]]
    cluster.kubectl("patch", "inferencedeployment", NAME, "-n", namespace, "--type=merge",
                    "--subresource=status", "-p",
                    json.dumps({"status": {"conditions": conditions}}))


def test_kv_token_secret_is_made_once_and_never_disclosed(cluster, operator, namespace, caplog):
    caplog.set_level(logging.DEBUG)
    obj = apply_sample(cluster, namespace)
    token, secret = kv_token(cluster, namespace)
    assert len(token) >= 43  # secrets.token_urlsafe(32)
    assert secret["type"] == "Opaque" and secret["immutable"] is True
    assert secret["metadata"]["ownerReferences"] == [{
        "apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment", "name": NAME,
        "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    listed = get_json(cluster, "secrets", "-n", namespace, "-l",
                      f"app.kubernetes.io/instance={NAME}")["items"]
    assert [s["metadata"]["name"] for s in listed] == [KV_SECRET]

    # A reconcile that makes sure the Secret exists (the deployment is not Ready) leaves it as
    # it is; so does a restarted operator.
    operator.stop()
    try:
        mark_not_ready(cluster, namespace)
        registry = CollectorRegistry()
        reconciler = Reconciler(KubeApi(cluster.api_client(), registry), registry)
        assert reconciler.reconcile_by_name(namespace, NAME).error is None
        assert registry.get_sample_value("heteroserve_operator_api_writes_total",
                                         {"verb": "create", "kind": "Secret"}) == 1
        assert kv_token(cluster, namespace) == (token, secret)
    finally:
        operator.start()
    wait_for(lambda: operator.metric("heteroserve_operator_reconciles_total", result="ok") >= 1,
             what="the restarted operator to reconcile")
    wait_ready(cluster, namespace, NAME)
    assert kv_token(cluster, namespace) == (token, secret)

    # A spec change rolls the pods out (the Secret is made sure of first) and keeps the value.
    cluster.kubectl("patch", "inferencedeployment", NAME, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"router": {"requestTimeoutSeconds": 601}}}))
    wait_ready(cluster, namespace, NAME)
    assert kv_token(cluster, namespace) == (token, secret)

    # Rotation: a deleted Secret is made anew, with a new value, by the next reconcile that is
    # not idle (here a spec change; in a cluster, the restarted pods that cannot mount it).
    cluster.kubectl("delete", "secret", KV_SECRET, "-n", namespace)
    cluster.kubectl("patch", "inferencedeployment", NAME, "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"router": {"requestTimeoutSeconds": 602}}}))
    wait_for(lambda: cluster.kubectl("get", "secret", KV_SECRET, "-n", namespace,
                                     check=False).returncode == 0,
             what="the KV token Secret to be made anew")
    rotated, _ = kv_token(cluster, namespace)
    assert rotated != token
    wait_ready(cluster, namespace, NAME)

    # Neither value reaches the operator's logs (every process of this session), Events, the
    # status or any other child.
    texts = {path.name: path.read_text(errors="replace")
             for path in operator.logdir.glob("*.log")}
    texts["in-process log"] = caplog.text
    texts["events"] = cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    texts["inferencedeployment"] = cluster.kubectl(
        "get", "inferencedeployment", NAME, "-n", namespace, "-o", "json").stdout
    texts["children"] = cluster.kubectl(
        "get", "deployments,replicasets,pods,services,configmaps,pdb", "-n", namespace,
        "-o", "json").stdout
    assert "created the KV token Secret" in "".join(texts.values())
    for value in (token, rotated):
        for form in (value, base64.b64encode(value.encode()).decode()):
            leaks = [where for where, text in texts.items() if form in text]
            assert leaks == [], f"the KV token appears in {leaks}"
