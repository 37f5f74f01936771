"""The operator under faults, on the real test control plane (issue 14): SIGKILLs in the middle
of reconciles, apiserver restarts, children deleted or edited by hand, two replicas with peering.

Every verdict is read back from the apiserver (children, owner references, status conditions,
observedGeneration) or from the operators' own metrics; the measured figures are printed (run
with -s to see them). The random kill points come from HETEROSERVE_CHAOS_SEED when set.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import temporary_namespace
from tests.integration.conftest import (
    SAMPLES,
    OperatorProcess,
    condition,
    get_json,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.integration

MANAGED = "app.kubernetes.io/managed-by=heteroserve-operator"
CHILD_KINDS = "configmaps,services,deployments.apps,poddisruptionbudgets.policy,ingresses,secrets"
# Fields the apiserver or other controllers fill in differently in two runs of the same spec.
VOLATILE_ANNOTATIONS = {"deployment.kubernetes.io/revision"}
# Digests of a whole rendered manifest (its namespace and owner uid included) and of the router
# configuration (which names Services by their namespace): they differ between namespaces by
# construction; the content they digest is compared instead.
DIGESTS = {"heteroserve.io/spec-hash", "heteroserve.io/config-hash"}
VOLATILE_SPEC = {"clusterIP", "clusterIPs"}


def figure(text: str) -> None:
    print(f"\n[faults] {text}", flush=True)


@pytest.fixture(scope="module")
def session_operator_aside(operator) -> Iterator[None]:
    """These tests run operators of their own; the session's operator steps aside meanwhile
    (two standalone operators would both act)."""
    operator.stop()
    try:
        yield
    finally:
        operator.start()


@pytest.fixture
def own_operator(cluster, crd_installed, session_operator_aside, tmp_path
                 ) -> Iterator[OperatorProcess]:
    process = OperatorProcess(cluster.kubeconfig, tmp_path)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def second_namespace(cluster) -> Iterator[str]:
    with temporary_namespace(cluster) as name:
        yield name


# -- reading the state back ------------------------------------------------------------------
def inference_deployments(cluster, namespace: str) -> dict[str, dict]:
    return {i["metadata"]["name"]: i
            for i in get_json(cluster, "inferencedeployments", "-n", namespace)["items"]}


def children(cluster, namespace: str) -> list[dict]:
    return get_json(cluster, CHILD_KINDS, "-n", namespace, "-l", MANAGED)["items"]


def comparable(item: dict, namespace: str) -> dict:
    """What a child holds that an undisturbed run would hold too: the namespace and uids
    masked, fields the cluster assigns dropped, the Secret's random value reduced to its keys."""
    meta = item["metadata"]
    body = {k: v for k, v in item.items()
            if k not in ("metadata", "status", "apiVersion", "kind")}
    if item["kind"] == "Secret":
        body["data"] = sorted(body.get("data", {}))
    if isinstance(body.get("spec"), dict):
        body["spec"] = {k: v for k, v in body["spec"].items() if k not in VOLATILE_SPEC}
    owners = [(r["kind"], r["name"], r.get("controller", False))
              for r in meta.get("ownerReferences", []) or []]
    text = json.dumps(_mask_digests({
        "labels": meta.get("labels", {}),
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items()
                        if k not in VOLATILE_ANNOTATIONS},
        "owners": owners, "body": body}), sort_keys=True)
    return json.loads(text.replace(namespace, "<namespace>"))


def _mask_digests(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<digest>" if k in DIGESTS else _mask_digests(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_digests(v) for v in value]
    return value


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The paths where two JSON values differ, with both values: an assertion message."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def state(cluster, namespace: str) -> dict[str, dict]:
    return {f"{c['kind']}/{c['metadata']['name']}": comparable(c, namespace)
            for c in children(cluster, namespace)}


def orphans_and_strays(cluster, namespace: str) -> list[str]:
    """Children whose controller is not exactly one live InferenceDeployment of their label."""
    owners = {name: obj["metadata"]["uid"]
              for name, obj in inference_deployments(cluster, namespace).items()
              if not obj["metadata"].get("deletionTimestamp")}
    problems = []
    for child in children(cluster, namespace):
        meta = child["metadata"]
        refs = [r for r in meta.get("ownerReferences", []) or [] if r.get("controller")]
        label = meta["labels"].get("heteroserve.io/inference-deployment")
        if len(refs) != 1 or refs[0]["uid"] != owners.get(label):
            problems.append(f"{child['kind']}/{meta['name']}: controllers {refs}, "
                            f"owner label {label}")
    return problems


def converged(cluster, namespace: str, names: list[str]) -> bool:
    """Every InferenceDeployment Ready for its generation, and each Deployment's live pods
    are exactly its replicas of its current template (no duplicates left from a roll-out)."""
    objs = inference_deployments(cluster, namespace)
    for name in names:
        obj = objs.get(name)
        cond = condition(obj, "Ready") if obj else None
        if not (cond and cond["status"] == "True" and obj["status"].get(
                "observedGeneration") == obj["metadata"]["generation"]):
            return False
    pods = get_json(cluster, "pods", "-n", namespace)["items"]
    for deployment in get_json(cluster, "deployments", "-n", namespace, "-l", MANAGED)["items"]:
        selector = deployment["spec"]["selector"]["matchLabels"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())]
        if deployment["status"].get("observedGeneration") != deployment["metadata"][
                "generation"] or len(live) != deployment["spec"]["replicas"] or \
                deployment["status"].get("updatedReplicas") != deployment["spec"]["replicas"]:
            return False
    return True


# -- the workload ------------------------------------------------------------------------------
def document(sample: str, name: str, step: int) -> dict:
    """A sample with what changes at each step of the chaos: the decode tier's replicas
    (1 <-> 2: its PodDisruptionBudget is made and pruned) and the router's timeout (its
    ConfigMap and the Deployments' config hash change)."""
    doc = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    doc["metadata"] = {"name": name}
    doc["spec"]["decode"]["replicas"] = 1 + step % 2
    doc["spec"].setdefault("router", {})["requestTimeoutSeconds"] = 600 + step
    return doc


WORKLOAD = (("builtin-gpu-prefill-cpu-decode", "pd-a"), ("builtin-gpu-prefill-cpu-decode", "pd-b"),
            ("builtin-smollm2-cpu", "cpu-c"))


def apply_step(cluster, namespace: str, step: int) -> None:
    documents = [document(sample, name, step) for sample, name in WORKLOAD]
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    stdin="\n---\n".join(json.dumps(d) for d in documents))


# -- 1. SIGKILL in the middle of reconciles -------------------------------------------------------
KILLS = 20


def test_sigkill_mid_reconcile_leaves_no_orphans_and_the_undisturbed_state(
        cluster, own_operator, namespace, second_namespace):
    seed = int(os.environ.get("HETEROSERVE_CHAOS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    names = [name for _sample, name in WORKLOAD]
    started = time.monotonic()
    mid_reconcile = 0
    for step in range(KILLS):
        apply_step(cluster, namespace, step)   # a change for the operator to be busy with
        own_operator.start()
        # A random point of its reconciles: one kill in five during start-up (listing,
        # reading), the others a random time after its first write (applying children,
        # pruning, writing status). The operator converges a step in about a second, so a
        # fixed window after start-up (it was 0-2.5 s) mostly killed it after convergence.
        in_start_up, start_up_s, after_write_s = (rng.random() < 0.2, rng.uniform(0.0, 0.3),
                                                  rng.uniform(0.0, 0.8))
        deadline = time.monotonic() + (start_up_s if in_start_up else 10.0)
        writes, waiting_for_write = 0.0, not in_start_up
        while time.monotonic() < deadline:
            writes = max(writes, own_operator.metric("heteroserve_operator_api_writes_total"))
            if writes and waiting_for_write:
                deadline, waiting_for_write = time.monotonic() + after_write_s, False
            time.sleep(0.02)
        own_operator.kill()
        if writes and not converged(cluster, namespace, names):
            mid_reconcile += 1
    chaos_s = time.monotonic() - started
    # The undisturbed run: the same final specs, created anew in another namespace.
    apply_step(cluster, second_namespace, KILLS - 1)
    own_operator.start()
    started = time.monotonic()
    for ns in (namespace, second_namespace):
        wait_for(lambda ns=ns: converged(cluster, ns, names), 120,
                 what=f"{ns} to converge after the kills")
    settle_s = time.monotonic() - started
    figure(f"SIGKILL x{KILLS} (seed {seed}): {mid_reconcile} kills landed after the operator's "
           f"first write and before convergence; chaos {chaos_s:.0f} s; converged "
           f"{settle_s:.1f} s after the last start")
    assert mid_reconcile >= KILLS // 4, "too few kills landed in the middle of a reconcile"
    assert orphans_and_strays(cluster, namespace) == []
    assert orphans_and_strays(cluster, second_namespace) == []
    after_chaos, undisturbed = state(cluster, namespace), state(cluster, second_namespace)
    assert sorted(after_chaos) == sorted(undisturbed)
    for key in undisturbed:
        assert after_chaos[key] == undisturbed[key], (key, differences(after_chaos[key],
                                                                      undisturbed[key]))
    # One KV token Secret per deployment, never a second one from a replayed create.
    secrets = get_json(cluster, "secrets", "-n", namespace, "-l", MANAGED)["items"]
    assert sorted(s["metadata"]["name"] for s in secrets) == [
        "pd-a-kv-token", "pd-b-kv-token"]


def router_timeout(configmap_json: str) -> float | None:
    config = yaml.safe_load(json.loads(configmap_json)["data"]["router.yaml"])
    return config.get("requestTimeoutSeconds")


# -- 2. apiserver restarts ---------------------------------------------------------------------
RESTARTS = 5
PD = ("builtin-gpu-prefill-cpu-decode", "pd")


def router_slice_stale(cluster, namespace: str, name: str) -> bool:
    """Whether `name` waits on its router's EndpointSlice alone while that slice lags the pods:
    its tiers Ready, RouterReady False for want of endpoints, and no router pod (the prefill
    pods, which carry the router) ready at an address the Service's slices list as ready."""
    obj = get_json(cluster, "inferencedeployment", name, "-n", namespace)
    conditions = {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}
    if not (conditions.get("PrefillReady", {}).get("status") == "True"
            and conditions.get("DecodeReady", {}).get("status") == "True"
            and conditions.get("RouterReady", {}).get("reason") == "NoReadyEndpoints"):
        return False
    pods = get_json(cluster, "pods", "-n", namespace, "-l",
                    f"app.kubernetes.io/instance={name},app.kubernetes.io/component=prefill")
    ready_ips = {p["status"].get("podIP") for p in pods["items"]
                 if any(c["type"] == "Ready" and c["status"] == "True"
                        for c in p["status"].get("conditions", []))}
    slices = get_json(cluster, "endpointslices", "-n", namespace, "-l",
                      f"kubernetes.io/service-name={name}")
    listed = {address for s in slices["items"] for e in s.get("endpoints") or []
              if (e.get("conditions") or {}).get("ready") for address in e["addresses"]}
    return bool(ready_ips) and not ready_ips & listed


def test_apiserver_restarts_under_activity(cluster, own_operator, namespace):
    own_operator.start()
    pid = own_operator.proc.pid
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    stdin=json.dumps(document(*PD, step=0)))
    wait_ready(cluster, namespace, "pd")
    recoveries, downtimes = [], []
    for restart in range(RESTARTS):
        # Activity: a change the operator is reconciling when the apiserver goes away.
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        stdin=json.dumps(document(*PD, step=2 * restart + 1)))
        downtimes.append(cluster.plane.restart_apiserver(down_seconds=1.0))
        # A change made meanwhile (while the operator's watches reconnect), and a child gone.
        changed_at = time.monotonic()
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        stdin=json.dumps(document(*PD, step=2 * restart + 2)))
        cluster.kubectl("delete", "configmap", "pd-router", "-n", namespace)
        generation = get_json(cluster, "inferencedeployment", "pd", "-n", namespace
                              )["metadata"]["generation"]

        timeout = 600 + 2 * restart + 2

        def handled(generation=generation, timeout=timeout):
            """The operator saw the new generation and its children say so: the router
            ConfigMap is back with the new timeout, the decode tier is down to one replica and
            its PodDisruptionBudget pruned. (Ready is not awaited: the controller-manager's own
            queues back off exponentially while the apiserver is away.)"""
            obj = get_json(cluster, "inferencedeployment", "pd", "-n", namespace)
            router = cluster.kubectl("get", "configmap", "pd-router", "-n", namespace,
                                     "-o", "json", check=False)
            decode = get_json(cluster, "deployment", "pd-decode", "-n", namespace)
            pdb = cluster.kubectl("get", "pdb", "pd-decode", "-n", namespace, check=False)
            return (obj["status"].get("observedGeneration") == generation
                    and router.returncode == 0 and router_timeout(router.stdout) == timeout
                    and decode["spec"]["replicas"] == 1 and pdb.returncode != 0)

        try:
            wait_for(handled, 60,
                     what=f"the change made around restart {restart + 1} to be handled")
        except AssertionError as error:
            obj = get_json(cluster, "inferencedeployment", "pd", "-n", namespace)
            raise AssertionError(f"{error}\nstatus: {json.dumps(obj.get('status'))}\n"
                                 f"generation {obj['metadata']['generation']}") from None
        recoveries.append(time.monotonic() - changed_at)
        assert own_operator.alive() and own_operator.proc.pid == pid, \
            f"the operator exited (see {own_operator.log_path})"
    figure(f"apiserver restarts x{RESTARTS}: down-to-ready {max(downtimes):.1f} s at most; "
           f"changes handled in {statistics.median(recoveries):.1f} s median, "
           f"{max(recoveries):.1f} s max after the apiserver was back")
    assert orphans_and_strays(cluster, namespace) == []
    # Every tier rolls out. Three CI runs failed here or in the next test with pd-decode never
    # rolled out: its old ReplicaSet alone had pods, at the Deployment's count, with the
    # desired-replicas annotation of the step before (read back from the failed run's etcd), which
    # holds kube-controller-manager's rollout for good (kubernetes/kubernetes#102551). The
    # operator releases such a rollout (rollout.py; the next test makes that state on purpose).
    try:
        wait_ready(cluster, namespace, "pd", timeout=120)
    except AssertionError:
        # One CI run (2026-11-29) had both tiers Ready and RouterReady False ("0 router
        # endpoints ready") for 120 s: the router Service's EndpointSlice still listed the
        # replaced prefill pod's address, not the new pod's. That slice is kube-controller-
        # manager's (its EndpointSlice controller retries a failed sync with a backoff of up to
        # 1000 s), and the operator read it right. Only that state gets the controllers
        # restarted, after which they sync every Service at once; any other state fails here.
        if not router_slice_stale(cluster, namespace, "pd"):
            raise
        figure(f"the router's EndpointSlice was stale after 120 s; controllers restarted in "
               f"{cluster.plane.restart_controllers():.1f} s")
        wait_ready(cluster, namespace, "pd", timeout=120)
    released = {tier: own_operator.metric("heteroserve_operator_rollouts_released_total",
                                          component=tier) for tier in ("prefill", "decode")}
    figure(f"rollouts held by the controller-manager and released by the operator: {released}")


# -- 2b. a rollout the controller-manager holds --------------------------------------------------
def owned_replica_sets(cluster, namespace: str, deployment: dict) -> list[dict]:
    labels = deployment["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    return [rs for rs in get_json(cluster, "replicasets", "-n", namespace, "-l", selector)["items"]
            if any(r["uid"] == deployment["metadata"]["uid"]
                   for r in rs["metadata"].get("ownerReferences", []) or [])]


def test_a_rollout_the_controller_manager_holds_is_released(cluster, own_operator, namespace):
    """kube-controller-manager holds a maxSurge-0 rollout for good when the only ReplicaSet with
    pods has the Deployment's count but a desired-replicas annotation from before a change of
    replicas (rollout.py; kubernetes/kubernetes#102551). The annotation is set by hand here, as
    the race leaves it; the controller-manager's verdict is read with no operator running, then
    the operator must release the rollout, once, and say so in an Event."""
    own_operator.start()
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    stdin=json.dumps(document(*PD, step=0)))   # decode replicas 1
    wait_ready(cluster, namespace, "pd")
    own_operator.stop()
    decode = get_json(cluster, "deployment", "pd-decode", "-n", namespace)
    (old,) = [rs for rs in owned_replica_sets(cluster, namespace, decode)
              if rs["spec"]["replicas"] > 0]
    cluster.kubectl("annotate", "replicaset", old["metadata"]["name"], "-n", namespace,
                    "--overwrite", "deployment.kubernetes.io/desired-replicas=2")
    # A change of the pod template (an annotation the operator does not render, so its
    # reconciles keep it): the controller-manager alone takes its scaling step, which changes
    # nothing, and never creates a ReplicaSet for the new template.
    cluster.kubectl("patch", "deployment", "pd-decode", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"template": {"metadata": {"annotations": {
                        "heteroserve.test/nudge": "1"}}}}}))

    def seen(name="pd-decode"):
        d = get_json(cluster, "deployment", name, "-n", namespace)
        return d if d["status"].get("observedGeneration") == d["metadata"]["generation"] else None

    held = wait_for(seen, 60, what="the controller-manager to see the template change")
    assert held["status"].get("updatedReplicas", 0) == 0, held["status"]
    assert [rs["metadata"]["name"] for rs in owned_replica_sets(cluster, namespace, held)] == [
        old["metadata"]["name"]], "the controller-manager rolled out by itself"

    own_operator.start()
    started = time.monotonic()
    wait_for(lambda: (seen() or {}).get("status", {}).get("updatedReplicas") == 1, 90,
             what="the held rollout to be released")
    released_s = time.monotonic() - started
    wait_ready(cluster, namespace, "pd")
    figure(f"a held rollout: released and its new pod created {released_s:.1f} s after the "
           f"operator started, Ready {time.monotonic() - started:.1f} s after")
    assert own_operator.metric("heteroserve_operator_rollouts_released_total",
                               component="decode") == 1
    annotations = get_json(cluster, "replicaset", old["metadata"]["name"], "-n", namespace
                           )["metadata"]["annotations"]
    assert annotations["deployment.kubernetes.io/desired-replicas"] == "1"
    assert annotations["deployment.kubernetes.io/max-replicas"] == "1"   # maxSurge 0
    (pod,) = [p for p in get_json(cluster, "pods", "-n", namespace, "-l",
                                  "app.kubernetes.io/component=decode")["items"]
              if not p["metadata"].get("deletionTimestamp")]
    assert pod["metadata"]["annotations"].get("heteroserve.test/nudge") == "1"
    events = get_json(cluster, "events", "-n", namespace,
                      "--field-selector", "reason=RolloutReleased")["items"]
    assert len(events) == 1 and old["metadata"]["name"] in events[0]["message"], events


# -- 3. children deleted or edited by hand ------------------------------------------------------
def _json_patch(kind: str, name: str, ops: list[dict]) -> tuple[str, ...]:
    return ("patch", kind, name, "--type=json", "-p", json.dumps(ops))


HAND_EDITS = (
    ("delete", "service", "pd-decode"),
    ("delete", "configmap", "pd-router"),
    _json_patch("deployment", "pd-decode", [{"op": "replace", "path": "/spec/replicas",
                                              "value": 5}]),
    _json_patch("deployment", "pd-decode", [{
        "op": "replace", "path": "/spec/template/spec/containers/0/env/0/value",
        "value": "9"}]),
    ("delete", "poddisruptionbudget", "pd-decode"),
    ("delete", "deployment", "pd-prefill"),
    _json_patch("configmap", "pd-router", [{"op": "replace", "path": "/data",
                                             "value": {"router.yaml": "{}"}}]),
    _json_patch("service", "pd", [{"op": "remove",
                                    "path": "/metadata/labels/app.kubernetes.io~1managed-by"}]),
    ("delete", "deployment", "pd-decode"),
    _json_patch("poddisruptionbudget", "pd-decode", [{
        "op": "replace", "path": "/spec/maxUnavailable", "value": 0}]),
)
REPAIRS = 20


def test_children_deleted_or_edited_by_hand_are_restored(cluster, own_operator, namespace):
    own_operator.start()
    cluster.kubectl("apply", "-n", namespace, "-f", "-",
                    stdin=json.dumps(document(*PD, step=1)))   # two decode replicas: a PDB
    wait_ready(cluster, namespace, "pd")
    wanted = state(cluster, namespace)
    times = []
    for attempt in range(REPAIRS):
        edit = HAND_EDITS[attempt % len(HAND_EDITS)]
        kind, name = edit[1], edit[2]
        before = get_json(cluster, kind, name, "-n", namespace)["metadata"]
        edited_at = time.monotonic()
        cluster.kubectl(*edit, "-n", namespace)

        def restored(kind=kind, name=name, before=before, edit=edit):
            result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json",
                                     check=False)
            if result.returncode != 0:
                return False
            live = json.loads(result.stdout)
            key = f"{live['kind']}/{name}"
            # A deleted child comes back as a new object; an edited one keeps its uid.
            return comparable(live, namespace) == wanted[key] and (
                live["metadata"]["uid"] != before["uid"] or edit[0] == "patch")

        wait_for(restored, 30, interval=0.05, what=f"{' '.join(edit[:3])} to be repaired")
        times.append(time.monotonic() - edited_at)
        # 120 s: once in several CI runs the cluster's own controllers (not the operator: the
        # child was already repaired above) took over 60 s to bring the pods back; say what was
        # left if it ever times out
        try:
            wait_for(lambda: converged(cluster, namespace, ["pd"]), 120,
                     what="the deployment to be Ready again")
        except AssertionError as exc:
            pods = [(p["metadata"]["name"], p["status"].get("phase"))
                    for p in get_json(cluster, "pods", "-n", namespace)["items"]]
            status = inference_deployments(cluster, namespace).get("pd", {}).get("status")
            raise AssertionError(f"{exc} after {' '.join(edit[:3])}; status {status}; "
                                 f"pods {pods}") from exc
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    figure(f"hand edits x{REPAIRS}: repaired in {statistics.median(times):.2f} s median, "
           f"p99 {p99:.2f} s (max {max(times):.2f} s)")
    assert p99 < 10
    assert state(cluster, namespace) == wanted
    assert orphans_and_strays(cluster, namespace) == []


# -- 4. two replicas with peering ----------------------------------------------------------------
PEERING = "heteroserve-test"


def peers(cluster) -> dict[str, Any]:
    result = cluster.kubectl("get", "clusterkopfpeering", PEERING, "-o", "json", check=False)
    return json.loads(result.stdout).get("status", {}) or {} if result.returncode == 0 else {}


def keepalive_lapses_at(cluster, priority: int) -> dt.datetime:
    """When the last keep-alive of the replica of this priority lapses (wall clock)."""
    for info in peers(cluster).values():
        if isinstance(info, dict) and info.get("priority") == priority:
            seen = dt.datetime.fromisoformat(info["lastseen"].replace("Z", "+00:00"))
            seen = seen if seen.tzinfo else seen.replace(tzinfo=dt.UTC)
            return seen + dt.timedelta(seconds=int(info["lifetime"]))
    raise AssertionError(f"no keep-alive of priority {priority} in {peers(cluster)}")


def test_two_replicas_with_peering_one_acts_and_hands_over(cluster, crd_installed,
                                                           session_operator_aside, namespace,
                                                           tmp_path):
    cluster.plane.install_kopf_peering_crds()
    high = OperatorProcess(cluster.kubeconfig, tmp_path, name="high",
                           extra_args=("--peering", PEERING, "--priority", "200"))
    low = OperatorProcess(cluster.kubeconfig, tmp_path, name="low",
                          extra_args=("--peering", PEERING, "--priority", "100"))
    try:
        # The passive replica joins an active one (started alone, either would act at once).
        high.start()
        wait_for(lambda: [p["priority"] for p in peers(cluster).values()
                          if p.get("lifetime")] == [200],
                 what="the first replica's keep-alive in the peering object")
        low.start()
        wait_for(lambda: sorted(p["priority"] for p in peers(cluster).values()
                                if p.get("lifetime")) == [100, 200],
                 what="both replicas to be listed in the peering object")
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        stdin=json.dumps(document(*PD, step=1)))
        wait_ready(cluster, namespace, "pd")
        # Both resync every 10 s: once the passive one has skipped a resync, it has had every
        # chance to act.
        wait_for(lambda: low.metric("heteroserve_operator_resyncs_total", acted="false") >= 1,
                 30, what="the passive replica to pass a resync by")
        assert high.metric("heteroserve_operator_reconciles_total") >= 1
        assert high.metric("heteroserve_operator_api_writes_total") >= 1
        assert low.metric("heteroserve_operator_reconciles_total") == 0
        assert low.metric("heteroserve_operator_api_writes_total") == 0
        assert low.metric("heteroserve_operator_resyncs_total", acted="true") == 0

        # The active replica dies without notice; a change made at once is the passive
        # replica's to handle, once the active one's last keep-alive lapses.
        high.kill()
        killed_at = time.monotonic()
        lapses_at = keepalive_lapses_at(cluster, 200)   # a dead replica renews nothing
        cluster.kubectl("apply", "-n", namespace, "-f", "-",
                        stdin=json.dumps(document(*PD, step=2)))
        generation = get_json(cluster, "inferencedeployment", "pd", "-n", namespace
                              )["metadata"]["generation"]
        wait_for(lambda: get_json(cluster, "inferencedeployment", "pd", "-n", namespace
                                  )["status"].get("observedGeneration") == generation,
                 60, interval=0.1, what="the passive replica to take over")
        handover_s = time.monotonic() - killed_at
        after_lapse_s = (dt.datetime.now(dt.UTC) - lapses_at).total_seconds()
        wait_ready(cluster, namespace, "pd")
        figure(f"peering hand-over after SIGKILL of the active replica: {handover_s:.1f} s, "
               f"{after_lapse_s:.1f} s after its last keep-alive lapsed (lifetime 20 s)")
        # The passive replica took over on the lapse (not at its next periodic resync, which
        # in a real deployment may be minutes away), once, and queued the change: 0.4-0.6 s
        # after the lapse in runs on the 2-core VM. Both replicas resync every 10 s here, so
        # without the hand-over the change would wait 0-10 s more (CI once saw 30.1 s in all).
        assert low.metric("heteroserve_operator_handovers_total") == 1
        assert after_lapse_s < 5
        assert low.metric("heteroserve_operator_reconciles_total") >= 1
        assert cluster.kubectl("get", "poddisruptionbudget", "pd-decode", "-n", namespace,
                               check=False).returncode != 0   # step 2: one decode replica
        assert orphans_and_strays(cluster, namespace) == []
    finally:
        high.stop()
        low.stop()
        cluster.kubectl("delete", "clusterkopfpeering", PEERING, "--ignore-not-found",
                        check=False)
