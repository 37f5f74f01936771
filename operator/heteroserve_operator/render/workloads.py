"""The prefill and decode Deployments."""

from __future__ import annotations

from typing import Any

from ..api.models import InferenceDeploymentSpec
from . import kv_token, meta
from .accelerators import profile as accelerator_profile
from .containers import engine_container, model_volume, router_container, shm_volume
from .engines import EngineContainer
from .placement import DecodePlacement
from .security import pod_security_context

SERVING_LABEL = "heteroserve.io/serving"  # pods that carry a router; the Service selects them


def prefill_name(owner: meta.Owner) -> str:
    return f"{owner.name}-prefill"


def decode_name(owner: meta.Owner) -> str:
    return f"{owner.name}-decode"


def _volumes(spec: InferenceDeploymentSpec, engine: EngineContainer, owner: meta.Owner,
             router: bool, extra: list[dict]) -> tuple[list[dict], list[dict]]:
    volumes, mounts = model_volume(spec)
    shm, shm_mount = shm_volume(engine.shm_size)
    volumes, mounts = [*volumes, shm, *extra, *engine.volumes], [*mounts, shm_mount]
    if engine.config_files:
        volumes.append({"name": "engine-config", "configMap": {
            "name": f"{owner.name}-engine"}})
        mounts.append({"name": "engine-config", "mountPath": engine.config_dir,
                       "readOnly": True})
    if engine.kv_token:
        token, token_mount = kv_token.volume(owner)
        volumes.append(token)
        mounts.append(token_mount)
    if router:
        volumes.append({"name": "router-config", "configMap": {"name": f"{owner.name}-router"}})
    return volumes, mounts


def _pod_spec(containers: list[dict], volumes: list[dict], grace_seconds: int) -> dict[str, Any]:
    """No API token and no service links: engines and routers never talk to the API server."""
    return {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": grace_seconds,
    }


def _deployment(owner: meta.Owner, name: str, component: str, replicas: int,
                pod_labels: dict[str, str], pod_annotations: dict[str, str],
                pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.metadata(owner, name, component),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": meta.selector(owner, component)},
            # No surge: a surged pod would need cards or exclusive cores that are not free.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {**meta.labels(owner, component), **pod_labels},
                             "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }


def prefill_deployment(spec: InferenceDeploymentSpec, owner: meta.Owner,
                       engine: EngineContainer, config_hash: str) -> dict[str, Any]:
    prefill = spec.prefill
    accel = accelerator_profile(prefill.accelerator)
    volumes, mounts = _volumes(spec, engine, owner, router=True, extra=list(accel.volumes))
    limits = {**accel.limits, "memory": prefill.memory}
    # CPU is not requested: with sameNode decode the host cores belong to the decode pods; the
    # accelerator engine runs in the shared pool (Kunpeng BoostKit: the last cores of each node).
    resources = {"requests": {"memory": prefill.memory}, "limits": limits}
    containers = [
        engine_container(engine, resources, mounts + list(accel.mounts), accel.capabilities),
        router_container(spec, exclusive_cpu=False),
    ]
    pod_spec = _pod_spec(containers, volumes, grace_seconds=60)
    selector = {**accel.node_selector, **prefill.node_selector}
    if selector:
        pod_spec["nodeSelector"] = selector
    if accel.tolerations:
        pod_spec["tolerations"] = accel.tolerations
    return _deployment(owner, prefill_name(owner), "prefill", prefill.replicas,
                       {SERVING_LABEL: "true"}, {meta.CONFIG_HASH: config_hash}, pod_spec)


def decode_deployment(spec: InferenceDeploymentSpec, owner: meta.Owner, engine: EngineContainer,
                      placement: DecodePlacement, config_hash: str) -> dict[str, Any]:
    decode = spec.decode
    serving = spec.prefill is None  # CPU-only: the decode pods carry the router
    volumes, mounts = _volumes(spec, engine, owner, router=serving, extra=[])
    # Guaranteed QoS with integer CPUs: the kubelet's static CPU manager gives exclusive cores.
    amounts = {"cpu": str(decode.cpus), "memory": decode.memory}
    containers = [engine_container(engine, {"requests": amounts, "limits": dict(amounts)},
                                   mounts)]
    if serving:
        containers.append(router_container(spec, exclusive_cpu=True))
    pod_spec = _pod_spec(containers, volumes, grace_seconds=30)
    if decode.node_selector:
        pod_spec["nodeSelector"] = dict(decode.node_selector)
    affinity: dict[str, Any] = {}
    if placement.nodes:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In",
                "values": list(placement.nodes)}]}]}}
    if decode.placement == "sameNode":
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": meta.selector(owner, "prefill")},
            "topologyKey": "kubernetes.io/hostname"}]}
    if affinity:
        pod_spec["affinity"] = affinity
    pod_labels = {SERVING_LABEL: "true"} if serving else {}
    annotations = {meta.CONFIG_HASH: config_hash, meta.NUMA_PLAN: placement.plan.cpu_list}
    return _deployment(owner, decode_name(owner), "decode", decode.replicas, pod_labels,
                       annotations, pod_spec)
