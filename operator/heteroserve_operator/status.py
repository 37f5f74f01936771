"""Status from observations: conditions, replica counts, NUMA plans. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .api.models import InferenceDeploymentSpec
from .numa import NumaPlanError, plan_cpus
from .render import same_node
from .render.facts import ClusterFacts
from .render.placement import DecodePlacement

CONDITION_TYPES = ("Ready", "PrefillReady", "DecodeReady", "RouterReady", "Degraded")


@dataclass(frozen=True)
class Observed:
    """What the reconciler saw of the children after applying them."""

    prefill: dict[str, Any] | None = None      # Deployment .status (+ spec.replicas)
    decode: dict[str, Any] | None = None
    router_ready_endpoints: int = 0
    decode_pods: tuple[tuple[str, str], ...] = ()   # (pod, node) of scheduled decode pods
    facts: ClusterFacts = field(default_factory=ClusterFacts)


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
                   error: tuple[str, str] | None = None) -> dict[str, Any]:
    """The new status. `error` is (reason, message) when reconciling failed; then the tier
    conditions keep their previous values and Degraded/Ready say why."""
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
        conditions += [
            _condition("PrefillReady", prefill_ok,
                       "Available" if prefill_ok else "Progressing", prefill_msg, generation),
            _condition("DecodeReady", decode_ok,
                       "Available" if decode_ok else "Progressing", decode_msg, generation),
            _condition("RouterReady", router_ok,
                       "EndpointsReady" if router_ok else "NoReadyEndpoints",
                       f"{observed.router_ready_endpoints} router endpoints ready", generation),
            _condition("Degraded", False, "AsExpected", "", generation),
        ]
        ready = prefill_ok and decode_ok and router_ok
        waiting = [c["type"] for c in conditions[:3] if c["status"] != "True"]
        conditions.insert(0, _condition(
            "Ready", ready, "Ready" if ready else "Waiting",
            "serving" if ready else "waiting for " + ", ".join(waiting), generation))
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
    for condition in conditions:
        before = old.get(condition["type"])
        same = before is not None and before.get("status") == condition["status"]
        condition["lastTransitionTime"] = before.get("lastTransitionTime", now) if same else now
    status["conditions"] = sorted(conditions, key=lambda c: CONDITION_TYPES.index(c["type"]))
    return status


def transitions(previous: dict[str, Any], current: dict[str, Any]
                ) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for every condition whose status changed."""
    old = {c["type"]: c for c in previous.get("conditions", [])}
    events = []
    for condition in current.get("conditions", []):
        before = old.get(condition["type"])
        if before is not None and before.get("status") == condition["status"]:
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
