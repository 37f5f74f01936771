"""Status from observations: conditions, replica counts, NUMA plans. Pure.

Why a tier is not ready comes from the objects themselves, not from Events (aggregated, noisy,
expiring after an hour, and a separate read): a Deployment whose ReplicaSet cannot create pods
carries the ReplicaSet's `ReplicaFailure` condition (reason FailedCreate, the admission answer as
the message); a pod the scheduler cannot place carries `PodScheduled=False` reason Unschedulable
with the scheduler's message; a container that cannot start says why in its waiting state. Those
are stable while the cause lasts (the scheduler rewrites its message only when it changes), so a
status built from them is written when the cause changes, not on every retry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .api.models import InferenceDeploymentSpec
from .decode_bindings import FIELD as DECODE_BINDINGS
from .numa import NumaPlanError, plan_cpus
from .render import same_node
from .render.facts import ClusterFacts
from .render.meta import LABEL_COMPONENT
from .render.placement import DecodePlacement

CONDITION_TYPES = ("Ready", "PrefillReady", "DecodeReady", "RouterReady", "Degraded")
# The conditions whose transitions are Events (see transitions()).
EVENT_CONDITIONS = frozenset({"Ready", "Degraded"})


@dataclass(frozen=True)
class Observed:
    """What the reconciler saw of the children after applying them."""

    prefill: dict[str, Any] | None = None      # Deployment .status (+ spec.replicas)
    decode: dict[str, Any] | None = None
    router_ready_endpoints: int = 0
    decode_pods: tuple[tuple[str, str], ...] = ()   # (pod, node) of scheduled decode pods
    facts: ClusterFacts = field(default_factory=ClusterFacts)
    # The deployment's pods (both tiers), as listed: why a tier is not ready.
    pods: tuple[dict[str, Any], ...] = ()


# Reasons a tier is not ready, most fundamental first (a refused pod never gets scheduled).
REFUSED = "PodsRefused"              # admission (Pod Security, quota, a webhook) refused pods
UNSCHEDULABLE = "PodsUnschedulable"  # the scheduler finds no node (resources, selectors, taints)
FAILING = "PodsFailing"              # a container cannot start or keeps crashing
MESSAGE_LIMIT = 400  # characters of a container's termination message shown in status
DEADLINE = "ProgressDeadlineExceeded"  # the Deployment's own verdict, with its message
# Container waiting reasons that mean "will not start by itself" (not ContainerCreating).
STUCK_WAITING = frozenset({
    "CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


@dataclass(frozen=True)
class Trouble:
    """Why a tier is not ready: a condition reason and a message for people."""

    reason: str
    message: str


def _deployment_condition(deployment: dict[str, Any] | None, kind: str
                          ) -> dict[str, Any] | None:
    conditions = ((deployment or {}).get("status", {}) or {}).get("conditions", []) or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _pod_trouble(pod: dict[str, Any]) -> Trouble | None:
    """Why one pod does not run, from its own status (None: it runs or is getting there)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status", {}) or {}
    for condition in status.get("conditions", []) or []:
        if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"):
            return Trouble(UNSCHEDULABLE, f"pod {name}: {condition.get('message', '')}".strip())
    for container in [*(status.get("initContainerStatuses") or []),
                      *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            # Not the waiting message: CrashLoopBackOff's carries the growing back-off, which
            # would rewrite the status on every restart.
            last = (container.get("lastState") or {}).get("terminated") or {}
            detail = (f" (last exit: {last.get('reason', 'unknown')}, code "
                      f"{last.get('exitCode', '?')})" if last else "")
            # The container's termination message: heteroserve-bind writes why a CPU grant
            # breaks the seeds' rule there; the same grant gives the same words on every
            # restart, so the status stays put.
            said = " ".join((last.get("message") or "").split())
            if said:
                detail += f": {said[:MESSAGE_LIMIT]}"
            if waiting["reason"] != "CrashLoopBackOff" and waiting.get("message"):
                detail = f": {waiting['message']}"
            return Trouble(FAILING, f"pod {name}: container {container.get('name', '?')} "
                                    f"{waiting['reason']}{detail}")
    return None


def tier_trouble(tier: str, deployment: dict[str, Any] | None,
                 pods: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> Trouble | None:
    """Why the `tier` Deployment's pods are not ready, or None when nothing is known to be
    wrong (they are starting). `pods`: that tier's pods; terminating ones are ignored."""
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if failure is not None and failure.get("status") == "True":
        return Trouble(REFUSED, f"{tier}: {failure.get('reason', 'FailedCreate')}: "
                                f"{failure.get('message', '')}")
    live = sorted((p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")),
                  key=lambda p: p.get("metadata", {}).get("name", ""))
    found = [t for t in map(_pod_trouble, live) if t is not None]
    for reason in (UNSCHEDULABLE, FAILING):
        same = [t for t in found if t.reason == reason]
        if same:
            more = f" ({len(same)} of {len(live)} {tier} pods)" if len(same) > 1 else ""
            return Trouble(reason, f"{tier} {same[0].message}{more}")
    progressing = _deployment_condition(deployment, "Progressing")
    if progressing is not None and progressing.get("status") == "False" \
            and progressing.get("reason") == DEADLINE:
        return Trouble(DEADLINE, f"{tier}: {progressing.get('message', '')}")
    return None


def _tier_pods(observed: Observed, component: str) -> list[dict[str, Any]]:
    return [p for p in observed.pods
            if (p.get("metadata", {}).get("labels") or {}).get(LABEL_COMPONENT) == component]


def _tier(deployment: dict[str, Any] | None, wanted: int
          ) -> tuple[bool, int, str]:
    if deployment is None:
        return False, 0, "the Deployment does not exist yet"
    status = deployment.get("status", {})
    ready = int(status.get("readyReplicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    generation = deployment.get("metadata", {}).get("generation", 0)
    current = status.get("observedGeneration", 0) >= generation
    ok = current and ready >= wanted and updated >= wanted
    return ok, ready, f"{ready}/{wanted} pods ready"


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int
               ) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message, "observedGeneration": generation}


def numa_plans(spec: InferenceDeploymentSpec, placement: DecodePlacement | None,
               observed: Observed) -> list[dict[str, Any]]:
    if spec.decode is None or placement is None:
        return []
    plan = placement.plan
    plans = [{"pod": "template", "node": ",".join(placement.nodes), "cpus": plan.cpu_list,
              "threads": plan.threads, "numaNodes": list(plan.numa_node_ids)}]
    topologies = {n.name: n.topology for n in observed.facts.nodes if n.topology}
    for pod, node in sorted(observed.decode_pods):
        topology = topologies.get(node)
        try:
            pod_plan = plan_cpus(topology, spec.decode.cpus, spec.decode.numa_nodes,
                                 spec.decode.reserved_cpus_per_numa_node) if topology else plan
        except NumaPlanError:
            pod_plan = plan
        plans.append({"pod": pod, "node": node, "cpus": pod_plan.cpu_list,
                      "threads": pod_plan.threads, "numaNodes": list(pod_plan.numa_node_ids)})
    return plans


def compute_status(spec: InferenceDeploymentSpec | None, generation: int,
                   previous: dict[str, Any], now: str, *, endpoint: str | None = None,
                   placement: DecodePlacement | None = None,
                   observed: Observed | None = None,
                   error: tuple[str, str] | None = None,
                   decode_bindings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The new status. `error` is (reason, message) when reconciling failed; then the tier
    conditions keep their previous values and Degraded/Ready say why. `decode_bindings`: the
    binding scraper's entries (None: it has none for this deployment yet)."""
    old = {c["type"]: c for c in previous.get("conditions", [])}
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {"observedGeneration": generation}
    if error is None and spec is not None and observed is not None:
        prefill_ok, prefill_ready, prefill_msg = (
            _tier(observed.prefill, spec.prefill.replicas) if spec.prefill
            else (True, 0, "no prefill tier requested"))
        if spec.decode is None:
            decode_ok, decode_ready, decode_msg = True, 0, "no decode tier requested"
        elif same_node.shares_pod(spec):
            # A prefill pod is Ready only when its decode engine is: the same count.
            decode_ok, decode_ready, decode_msg = _tier(observed.prefill, spec.decode.replicas)
            decode_msg += " (each decode engine in a prefill pod: placement sameNode)"
        else:
            decode_ok, decode_ready, decode_msg = _tier(observed.decode, spec.decode.replicas)
        router_ok = observed.router_ready_endpoints > 0
        # Only a tier short of ready pods is examined: a stray pending pod beside a tier that
        # serves at its replica count degrades nothing.
        prefill_trouble = decode_trouble = None
        if spec.prefill and not prefill_ok:
            prefill_trouble = tier_trouble("prefill", observed.prefill,
                                           _tier_pods(observed, "prefill"))
        if spec.decode is not None and not decode_ok:
            decode_trouble = (prefill_trouble if same_node.shares_pod(spec) else tier_trouble(
                "decode", observed.decode, _tier_pods(observed, "decode")))

        def tier_condition(kind: str, ok: bool, message: str, trouble: Trouble | None):
            if ok:
                return _condition(kind, True, "Available", message, generation)
            if trouble is None:
                return _condition(kind, False, "Progressing", message, generation)
            return _condition(kind, False, trouble.reason, f"{message}: {trouble.message}",
                              generation)

        troubles = [t for t in (prefill_trouble, decode_trouble) if t is not None]
        if decode_trouble is prefill_trouble and prefill_trouble is not None:
            troubles = [prefill_trouble]
        conditions += [
            tier_condition("PrefillReady", prefill_ok, prefill_msg, prefill_trouble),
            tier_condition("DecodeReady", decode_ok, decode_msg, decode_trouble),
            _condition("RouterReady", router_ok,
                       "EndpointsReady" if router_ok else "NoReadyEndpoints",
                       f"{observed.router_ready_endpoints} router endpoints ready", generation),
            _condition("Degraded", bool(troubles),
                       troubles[0].reason if troubles else "AsExpected",
                       "; ".join(t.message for t in troubles), generation),
        ]
        ready = prefill_ok and decode_ok and router_ok
        waiting = [c["type"] for c in conditions[:3] if c["status"] != "True"]
        if ready:
            conditions.insert(0, _condition("Ready", True, "Ready", "serving", generation))
        elif troubles:
            conditions.insert(0, _condition(
                "Ready", False, troubles[0].reason,
                "; ".join(t.message for t in troubles), generation))
        else:
            conditions.insert(0, _condition(
                "Ready", False, "Waiting", "waiting for " + ", ".join(waiting), generation))
        status["endpoint"] = endpoint
        if spec.prefill:
            status["prefill"] = {"replicas": spec.prefill.replicas,
                                 "readyReplicas": prefill_ready}
        if spec.decode:
            status["decode"] = {"replicas": spec.decode.replicas, "readyReplicas": decode_ready}
        status["numaPlans"] = numa_plans(spec, placement, observed)
    else:
        reason, message = error or ("Unknown", "")
        for kind in ("PrefillReady", "DecodeReady", "RouterReady"):
            if kind in old:
                conditions.append(dict(old[kind]))
        conditions += [_condition("Degraded", True, reason, message, generation),
                       _condition("Ready", False, reason, message, generation)]
        for key in ("endpoint", "prefill", "decode", "numaPlans"):
            if key in previous:
                status[key] = previous[key]
    # Learned by binding_scraper.py: its entries when it has published some for this deployment
    # (none: the field goes), else the status's own, carried over as they are.
    if decode_bindings is None:
        if DECODE_BINDINGS in previous:
            status[DECODE_BINDINGS] = previous[DECODE_BINDINGS]
    elif decode_bindings:
        status[DECODE_BINDINGS] = decode_bindings
    for condition in conditions:
        before = old.get(condition["type"])
        same = before is not None and before.get("status") == condition["status"]
        condition["lastTransitionTime"] = before.get("lastTransitionTime", now) if same else now
    status["conditions"] = sorted(conditions, key=lambda c: CONDITION_TYPES.index(c["type"]))
    return status


def transitions(previous: dict[str, Any], current: dict[str, Any]
                ) -> list[tuple[str, str, str]]:
    """The Events of a status change: Normal when Ready turns True ("Ready") or back
    ("NotReady"), a Warning when Degraded turns True or stays True for another reason (refused
    pods, then unschedulable ones). The tiers' conditions (PrefillReady, DecodeReady,
    RouterReady) are in the status only: an Event for each of their transitions tripled the
    Events of every rollout (and the writes of the operator at scale) and told a user nothing
    the Ready event and `kubectl get infd -o yaml` do not."""
    old = {c["type"]: c for c in previous.get("conditions", [])}
    events = []
    for condition in current.get("conditions", []):
        if condition["type"] not in EVENT_CONDITIONS:
            continue
        before = old.get(condition["type"])
        if before is not None and before.get("status") == condition["status"]:
            if (condition["type"] == "Degraded" and condition["status"] == "True"
                    and before.get("reason") != condition["reason"]):
                events.append(("Warning", condition["reason"], condition["message"]))
            continue
        if condition["type"] == "Degraded":
            if condition["status"] == "True":
                events.append(("Warning", condition["reason"], condition["message"]))
            continue
        if condition["status"] == "True":
            events.append(("Normal", condition["type"], condition["message"] or "True"))
        elif before is not None:
            events.append(("Normal", f"Not{condition['type']}", condition["message"]))
    return events
