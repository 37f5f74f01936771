"""A Deployment rollout that kube-controller-manager holds for good, and its release. Pure.

Kubernetes' Deployment controller (every release to 1.36 at least: kubernetes/kubernetes#102551,
with fixes proposed in #102579, #138036 and #138840, none merged) can stop a rolling update
forever. With `maxSurge: 0` - the strategy of every tier the operator renders
(render/workloads.py: a surged pod would need cards or exclusive cores that are not free) - a
rollout first scales an old ReplicaSet down and stamps it with the Deployment's replica count
(the `deployment.kubernetes.io/desired-replicas` annotation). If the Deployment's `replicas`
then change so that the old ReplicaSet is the only one with pods and already has the new count,
every sync of the Deployment finds a "scaling event" (the annotation differs from
`spec.replicas`), and the scaling step returns early because the counts agree, without updating
the annotation; the rollout step is never reached. The old pods keep serving the old template,
`updatedReplicas` stays below `replicas`, and nothing in the Deployment says why.

For an InferenceDeployment this happens when `decode.replicas` (or `prefill.replicas`) and a
field of the pod template change while a rollout is under way: a CI run of the chaos tests,
which change both at every step, left a decode tier on its old template for good.

The release is what the proposed upstream fixes do: set that ReplicaSet's desired- and
max-replicas annotations to the Deployment's current values. The ReplicaSet's update event makes
the controller sync the Deployment again, it finds no scaling event and rolls out. Nothing else
of the ReplicaSet changes, and the write is conditional on the resourceVersion read (kube.py's
`annotate`), so a ReplicaSet that the controller changed in between is left to it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
DEFAULT_MAX_SURGE = "25%"   # the apiserver's default for a RollingUpdate Deployment
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class HeldRollout:
    """A ReplicaSet whose annotation holds its Deployment's rollout, and the annotations that
    release it."""

    replica_set: str
    resource_version: str
    stale_desired: str
    annotations: dict[str, str]


def _replicas(obj: dict[str, Any]) -> int:
    """spec.replicas; the apiserver defaults it to 1."""
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def desired_annotation(replica_set: dict[str, Any]) -> int | None:
    """The desired-replicas annotation as the controller reads it (strconv.ParseUint, base 10,
    at most int32's maximum); None where it ignores it: absent, or not such a number."""
    value = (replica_set["metadata"].get("annotations") or {}).get(DESIRED_REPLICAS)
    if value is None or not re.fullmatch(r"[0-9]+", value) or int(value) > INT32_MAX:
        return None
    return int(value)


def resolve_surge(value: int | str | None, replicas: int) -> int:
    """maxSurge as a count of pods: an int as it is, "N%" of `replicas` rounded up (the
    controller's rounding for surge)."""
    if value is None:
        value = DEFAULT_MAX_SURGE
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.endswith("%") or not text[:-1].isdigit():
        raise ValueError(f"maxSurge {value!r} is neither a count nor a percentage")
    return math.ceil(int(text[:-1]) * replicas / 100)


def may_be_held(deployment: dict[str, Any]) -> bool:
    """What the Deployment alone says, before its ReplicaSets are listed: a rolling update,
    not paused, whose current spec the controller has seen (observedGeneration), with fewer
    pods of the current template than wanted and pods of an older one. A rollout under way
    looks the same for a moment; held_rollout() tells them apart. A new Deployment (no pods
    yet, or all of its template) costs no list."""
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    strategy = (spec.get("strategy") or {}).get("type", "RollingUpdate")
    generation = (deployment.get("metadata") or {}).get("generation")
    updated = int(status.get("updatedReplicas") or 0)
    return (strategy == "RollingUpdate" and not spec.get("paused")
            and generation is not None and status.get("observedGeneration") == generation
            and updated < _replicas(deployment) and int(status.get("replicas") or 0) > updated)


def held_rollout(deployment: dict[str, Any], replica_sets: list[dict[str, Any]]
                 ) -> HeldRollout | None:
    """The ReplicaSet whose stale desired-replicas annotation holds `deployment` in the
    controller's scaling step (module doc), with the annotations that release it; None when
    the Deployment is not held so. `replica_sets`: those its selector matches (only the ones
    it controls count)."""
    if not may_be_held(deployment):
        return None
    uid = deployment["metadata"].get("uid")
    owned = [rs for rs in replica_sets
             if any(ref.get("uid") == uid and ref.get("controller")
                    for ref in rs["metadata"].get("ownerReferences") or [])]
    active = [rs for rs in owned if _replicas(rs) > 0]
    replicas = _replicas(deployment)
    # Two or more with pods: the controller scales them proportionally, and rewrites their
    # annotations; none: it scales the newest up.
    if len(active) != 1 or _replicas(active[0]) != replicas:
        return None
    (rs,) = active
    desired = desired_annotation(rs)
    if desired is None or desired == replicas:
        return None
    # Its pods are not of the current template (fewer pods have it than this ReplicaSet has):
    # else it is the new ReplicaSet, whose pods are being created, and nothing is held.
    updated = int((deployment.get("status") or {}).get("updatedReplicas") or 0)
    if int((rs.get("status") or {}).get("replicas") or 0) <= updated:
        return None
    rolling = (deployment["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    surge = resolve_surge(rolling.get("maxSurge"), replicas)
    return HeldRollout(
        replica_set=rs["metadata"]["name"],
        resource_version=rs["metadata"]["resourceVersion"],
        stale_desired=str(desired),
        annotations={DESIRED_REPLICAS: str(replicas), MAX_REPLICAS: str(replicas + surge)})
