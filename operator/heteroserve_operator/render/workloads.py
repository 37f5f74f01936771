"""The prefill and decode Deployments."""

from __future__ import annotations

import math
from typing import Any

from ..api.models import InferenceDeploymentSpec
from ..api.quantity import parse_quantity
from . import kv_token, meta, same_node
from .accelerators import profile as accelerator_profile
from .containers import engine_container, model_volume, router_container, shm_volume
from .engines import EngineContainer
from .placement import DecodePlacement
from .security import pod_security_context

SERVING_LABEL = "heteroserve.io/serving"  # pods that carry a router; the Service selects them
MIB = 2**20


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


def _pod_spec(engine: EngineContainer, containers: list[dict], volumes: list[dict],
              grace_seconds: int) -> dict[str, Any]:
    """No API token and no service links: engines and routers never talk to the API server.
    The pod's security context is the engine's (render/security.py); the engine's init
    containers run first."""
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(engine.security),
        "containers": containers,
        "volumes": volumes,
        "terminationGracePeriodSeconds": grace_seconds,
    }
    if engine.init_containers:
        pod["initContainers"] = [dict(c) for c in engine.init_containers]
    return pod


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
                       engine: EngineContainer, config_hash: str,
                       decode: EngineContainer | None = None,
                       placement: DecodePlacement | None = None) -> dict[str, Any]:
    """The prefill pods; with `decode` (render/same_node.py) each also runs a decode engine,
    the two sharing a memory-backed directory for the KV hand-off."""
    prefill = spec.prefill
    accel = accelerator_profile(prefill.accelerator)
    volumes, mounts = _volumes(spec, engine, owner, router=True, extra=list(accel.volumes))
    memory = prefill.memory
    # CPU is not requested: with sameNode decode the host cores belong to the decode pods; the
    # accelerator engine runs in the shared pool (Kunpeng BoostKit: the last cores of each node).
    requests: dict[str, str] = {}
    annotations = {meta.CONFIG_HASH: config_hash}
    if decode:
        channel, channel_mount = same_node.volume(spec)
        volumes.append(channel)
        mounts.append(channel_mount)
        # The channel's tmpfs pages are charged to their writer, the prefill engine.
        memory = f"{math.ceil((parse_quantity(memory) + same_node.channel_bytes(spec)) / MIB)}Mi"
        # A Guaranteed pod, so that the decode engine's cores are exclusive: every container
        # asks integer CPUs equal to its limits; the prefill engine gets the reserved cores.
        requests["cpu"] = str(same_node.host_cpus(spec, placement.plan))
        annotations[meta.NUMA_PLAN] = placement.plan.cpu_list
    requests["memory"] = memory
    resources = {"requests": requests, "limits": {**accel.limits, **requests}}
    containers = [
        engine_container(engine, resources, mounts + list(accel.mounts), accel.capabilities),
        router_container(spec, exclusive_cpu=decode is not None,
                         root_pod=engine.security.runs_as_root),
    ]
    if decode:
        decode_volumes, decode_container = _shared_pod_decode(spec, owner, decode)
        volumes += decode_volumes
        containers.insert(1, decode_container)
    pod_spec = _pod_spec(engine, containers, volumes, grace_seconds=60)
    selector = {**accel.node_selector, **engine.node_selector, **prefill.node_selector}
    if decode:
        selector.update(spec.decode.node_selector)
    if selector:
        pod_spec["nodeSelector"] = selector
    if accel.tolerations:
        pod_spec["tolerations"] = accel.tolerations
    if decode and placement.nodes:
        pod_spec["affinity"] = {"nodeAffinity": _on_nodes(placement.nodes)}
    return _deployment(owner, prefill_name(owner), "prefill", prefill.replicas,
                       {SERVING_LABEL: "true"}, annotations, pod_spec)


def _shared_pod_decode(spec: InferenceDeploymentSpec, owner: meta.Owner, engine: EngineContainer
                       ) -> tuple[list[dict], dict[str, Any]]:
    """The decode engine in the prefill pod, and the volumes it adds: it mounts what it shares
    with the prefill engine (model, KV token, the channel) and a /dev/shm of its own; integer
    CPUs and memory, requests equal to limits, as in a decode pod."""
    shm, shm_mount = shm_volume(engine.shm_size, same_node.DECODE_SHM_VOLUME)
    mounts = [*model_volume(spec)[1], shm_mount, same_node.volume(spec)[1]]
    if engine.kv_token:
        mounts.append(kv_token.volume(owner)[1])
    amounts = {"cpu": str(spec.decode.cpus), "memory": spec.decode.memory}
    container = engine_container(engine, {"requests": amounts, "limits": dict(amounts)}, mounts,
                                 name=same_node.DECODE_CONTAINER,
                                 port_name=same_node.DECODE_PORT_NAME)
    return [shm, *engine.volumes], container


def _on_nodes(nodes: tuple[str, ...]) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}]}}


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
        containers.append(router_container(spec, exclusive_cpu=True,
                                           root_pod=engine.security.runs_as_root))
    pod_spec = _pod_spec(engine, containers, volumes, grace_seconds=30)
    selector = {**engine.node_selector, **decode.node_selector}
    if selector:
        pod_spec["nodeSelector"] = selector
    affinity: dict[str, Any] = {}
    if placement.nodes:
        affinity["nodeAffinity"] = _on_nodes(placement.nodes)
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
