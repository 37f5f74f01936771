"""Why a tier is not ready, from the Deployment's and the pods' own conditions (status.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from heteroserve_operator.api.models import InferenceDeploymentSpec
from heteroserve_operator.status import (
    FAILING,
    REFUSED,
    UNSCHEDULABLE,
    Observed,
    compute_status,
    tier_trouble,
    transitions,
)

SAMPLES = Path(__file__).resolve().parents[2] / "crds" / "samples"
REFUSAL = ('pods "m-decode-7d9c-x2" is forbidden: violates PodSecurity "baseline:latest": '
           'hostPath volumes (volume "model")')
NO_CPU = ("0/6 nodes are available: 1 Insufficient cpu, 5 node(s) didn't match Pod's node "
          "affinity/selector. preemption: 0/6 nodes are available: 1 No preemption victims "
          "found for incoming pod, 5 Preemption is not helpful for scheduling.")


def spec(**decode) -> InferenceDeploymentSpec:
    return InferenceDeploymentSpec.model_validate({
        "model": {"name": "m", "path": "/models/m.gguf"},
        "decode": {"cpus": 4, "numaNodes": 1, "memory": "2Gi", **decode},
        "router": {"policy": "cpu"}})


def deployment(ready: int = 0, conditions: list | None = None, generation: int = 1) -> dict:
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": generation, "readyReplicas": ready,
                       "updatedReplicas": ready, "conditions": conditions or []}}


def refused() -> dict:
    return {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
            "message": REFUSAL}


def pod(name: str, component: str = "decode", *, unschedulable: str | None = None,
        waiting: tuple[str, str] | None = None, terminated: dict | None = None,
        deleting: bool = False) -> dict:
    meta: dict = {"name": name, "labels": {"app.kubernetes.io/component": component}}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict = {"phase": "Pending", "conditions": []}
    if unschedulable is not None:
        status["conditions"].append({"type": "PodScheduled", "status": "False",
                                     "reason": "Unschedulable", "message": unschedulable})
    if waiting is not None:
        status["containerStatuses"] = [{
            "name": "engine", "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}},
            "lastState": {"terminated": terminated} if terminated else {}}]
    return {"metadata": meta, "spec": {}, "status": status}


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_admission_refusal_degrades_with_the_replica_sets_message():
    status = compute_status(spec(), 1, {}, "t0", endpoint="e", observed=Observed(
        decode=deployment(conditions=[refused()])))
    c = conditions(status)
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == REFUSED
    assert c["Degraded"]["message"] == f"decode: FailedCreate: {REFUSAL}"
    assert c["DecodeReady"]["reason"] == REFUSED and REFUSAL in c["DecodeReady"]["message"]
    assert c["DecodeReady"]["message"].startswith("0/1 pods ready: ")
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == REFUSED
    assert c["PrefillReady"]["status"] == "True"  # no prefill tier asked for


def test_refusal_outranks_the_pods_and_a_resolved_failure_is_ignored():
    pods = (pod("m-decode-a", unschedulable=NO_CPU),)
    trouble = tier_trouble("decode", deployment(conditions=[refused()]), pods)
    assert trouble.reason == REFUSED
    cleared = {**refused(), "status": "False"}
    assert tier_trouble("decode", deployment(conditions=[cleared]), pods).reason == UNSCHEDULABLE
    assert tier_trouble("decode", deployment(conditions=[cleared]), ()) is None


def test_unschedulable_pod_degrades_with_the_schedulers_message():
    status = compute_status(spec(), 1, {}, "t0", endpoint="e", observed=Observed(
        decode=deployment(), pods=(pod("m-decode-b", unschedulable=NO_CPU),
                                   pod("m-decode-a", unschedulable=NO_CPU),
                                   pod("m-prefill-z", "prefill", unschedulable="other tier"))))
    c = conditions(status)
    assert c["Degraded"]["reason"] == UNSCHEDULABLE
    # The first pod by name, and how many share the cause; the prefill pod is not this tier's.
    assert c["Degraded"]["message"] == f"decode pod m-decode-a: {NO_CPU} (2 of 2 decode pods)"
    assert c["DecodeReady"]["reason"] == UNSCHEDULABLE


def test_starting_pods_are_progressing_not_degraded():
    status = compute_status(spec(), 1, {}, "t0", endpoint="e", observed=Observed(
        decode=deployment(), pods=(pod("m-decode-a"),
                                   pod("m-decode-old", unschedulable=NO_CPU, deleting=True))))
    c = conditions(status)
    assert c["Degraded"] == {**c["Degraded"], "status": "False", "reason": "AsExpected",
                             "message": ""}
    assert c["DecodeReady"]["reason"] == "Progressing"
    assert c["Ready"]["reason"] == "Waiting"


def test_a_ready_tier_is_not_degraded_by_a_stray_pending_pod():
    status = compute_status(spec(), 1, {}, "t0", endpoint="e", observed=Observed(
        decode=deployment(ready=1), router_ready_endpoints=1,
        pods=(pod("m-decode-surge", unschedulable=NO_CPU),)))
    c = conditions(status)
    assert c["Ready"]["status"] == "True" and c["Degraded"]["status"] == "False"


def test_containers_that_cannot_start():
    crash = tier_trouble("decode", deployment(), (pod(
        "m-decode-a", waiting=("CrashLoopBackOff", "back-off 40s restarting failed container"),
        terminated={"reason": "Error", "exitCode": 3}),))
    assert crash.reason == FAILING
    # No back-off figure: it grows on every restart and would rewrite the status each time.
    assert crash.message == ("decode pod m-decode-a: container engine CrashLoopBackOff "
                             "(last exit: Error, code 3)")
    pull = tier_trouble("decode", deployment(), (pod(
        "m-decode-a", waiting=("ImagePullBackOff", 'Back-off pulling image "x"')),))
    assert pull.message == 'decode pod m-decode-a: container engine ImagePullBackOff: ' \
                           'Back-off pulling image "x"'
    assert tier_trouble("decode", deployment(), (pod(
        "m-decode-a", waiting=("ContainerCreating", "")),)) is None


def test_a_refused_cpu_grant_says_why_in_status():
    """heteroserve-bind writes why a grant breaks the seeds' rule into the termination message;
    the status carries it (one line, bounded), the same on every restart."""
    said = ("the granted CPUs 0-2 span NUMA nodes 0 (2 CPUs) and 1 (1 CPU):\n"
            "threads must be equal per NUMA node")
    crash = tier_trouble("decode", deployment(), (pod(
        "m-decode-a", waiting=("CrashLoopBackOff", "back-off 5m0s restarting failed container"),
        terminated={"reason": "Error", "exitCode": 2, "message": said}),))
    assert crash.message == (
        "decode pod m-decode-a: container engine CrashLoopBackOff (last exit: Error, code 2): "
        "the granted CPUs 0-2 span NUMA nodes 0 (2 CPUs) and 1 (1 CPU): threads must be equal "
        "per NUMA node")
    long = tier_trouble("decode", deployment(), (pod(
        "m-decode-a", waiting=("CrashLoopBackOff", ""),
        terminated={"reason": "Error", "exitCode": 2, "message": "x" * 5000}),))
    assert len(long.message) < 600


def test_progress_deadline_is_reported_when_nothing_more_precise_is_known():
    stalled = {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
               "message": 'ReplicaSet "m-decode-1" has timed out progressing.'}
    trouble = tier_trouble("decode", deployment(conditions=[stalled]), ())
    assert trouble.reason == "ProgressDeadlineExceeded" and "timed out" in trouble.message


def test_same_node_pods_report_one_trouble_for_both_tiers():
    sample = SAMPLES / "builtin-gpu-prefill-cpu-decode-same-node.yaml"
    s = InferenceDeploymentSpec.model_validate(yaml.safe_load(sample.read_text())["spec"])
    status = compute_status(s, 1, {}, "t0", endpoint="e", observed=Observed(
        prefill=deployment(), pods=(pod("m-prefill-a", "prefill", unschedulable=NO_CPU),)))
    c = conditions(status)
    assert c["PrefillReady"]["reason"] == c["DecodeReady"]["reason"] == UNSCHEDULABLE
    assert c["Degraded"]["message"] == f"prefill pod m-prefill-a: {NO_CPU}"  # once, not twice


def test_status_is_stable_while_the_cause_lasts_and_clears_when_it_goes():
    observed = Observed(decode=deployment(), pods=(pod("m-decode-a", unschedulable=NO_CPU),))
    first = compute_status(spec(), 1, {}, "t0", endpoint="e", observed=observed)
    again = compute_status(spec(), 1, first, "t1", endpoint="e", observed=observed)
    assert again == first  # nothing to write on the next reconcile
    assert ("Warning", UNSCHEDULABLE, conditions(first)["Degraded"]["message"]) in \
        transitions({}, first)
    assert transitions(first, again) == []
    # Another cause while still degraded: its own Warning, the transition time kept.
    refusing = compute_status(spec(), 1, first, "t2", endpoint="e", observed=Observed(
        decode=deployment(conditions=[refused()])))
    assert conditions(refusing)["Degraded"]["lastTransitionTime"] == "t0"
    assert [e[:2] for e in transitions(first, refusing)] == [("Warning", REFUSED)]
    serving = compute_status(spec(), 1, refusing, "t3", endpoint="e", observed=Observed(
        decode=deployment(ready=1), router_ready_endpoints=1, pods=(pod("m-decode-a"),)))
    c = conditions(serving)
    assert c["Degraded"]["status"] == "False" and c["Degraded"]["reason"] == "AsExpected"
    assert c["Degraded"]["lastTransitionTime"] == "t3"
    assert ("Normal", "Ready", "serving") in transitions(refusing, serving)
