"""Container and volume pieces shared by the prefill and decode pods."""

from __future__ import annotations

import math
from typing import Any

from ..api.models import InferenceDeploymentSpec
from . import images
from .engines import EngineContainer
from .security import container_security_context, restricted_container_context

# Where the router ConfigMap (`router_config.router_configmap`, key `router.yaml`) is mounted.
ROUTER_CONFIG_DIR = "/etc/heteroserve/router"
ROUTER_CONFIG_FILE = "router.yaml"
ROUTER_CONFIG_PATH = f"{ROUTER_CONFIG_DIR}/{ROUTER_CONFIG_FILE}"


def env_list(env: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def probe(engine_port: int | str, path: str | None, period: int, failures: int) -> dict[str, Any]:
    check: dict[str, Any] = (
        {"httpGet": {"path": path, "port": engine_port}} if path
        else {"tcpSocket": {"port": engine_port}})
    return {**check, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5}


def engine_container(engine: EngineContainer, resources: dict[str, Any],
                     extra_mounts: list[dict[str, Any]],
                     capabilities: tuple[str, ...] = (), *, name: str = "engine",
                     port_name: str = "engine") -> dict[str, Any]:
    """`name`/`port_name`: another engine's in a pod that holds two (render/same_node.py).
    `capabilities`: the accelerator profile's, added to what the engine profile declares."""
    container: dict[str, Any] = {
        "name": name,
        "image": engine.image,
        "command": list(engine.command),
        "args": list(engine.args),
        "ports": [{"name": port_name, "containerPort": engine.port, "protocol": "TCP"}],
        # HOME: engines cache under $HOME, and the image's root home is not writable as non-root.
        "env": env_list({"HOME": "/tmp", **engine.env}) + [
            {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for name, path in sorted(engine.field_env.items())],
        "resources": resources,
        "volumeMounts": extra_mounts + list(engine.mounts),
        "startupProbe": probe(port_name, engine.health_path, 10,
                              max(1, math.ceil(engine.startup_seconds / 10))),
        "readinessProbe": probe(port_name, engine.health_path, 5, 3),
        "livenessProbe": probe(port_name, engine.health_path, 20, 3),
        "securityContext": container_security_context(
            engine.security.with_capabilities(capabilities)),
    }
    if engine.working_dir:
        container["workingDir"] = engine.working_dir
    return container


def router_container(spec: InferenceDeploymentSpec, exclusive_cpu: bool,
                     root_pod: bool = False) -> dict[str, Any]:
    """The router sidecar. In a Guaranteed decode pod it needs an integer CPU of its own. In the
    pod of an engine that runs as root (`root_pod`: no user at pod level) it says on itself that
    it runs restricted, as UID 1000."""
    memory = "512Mi"
    resources: dict[str, Any] = {"requests": {"memory": memory}, "limits": {"memory": memory}}
    if exclusive_cpu:
        resources = {"requests": {"cpu": "1", "memory": memory},
                     "limits": {"cpu": "1", "memory": memory}}
    return {
        "name": "router",
        "image": spec.router.image or images.ROUTER,
        "command": ["heteroserve-router"],
        "args": ["--config", ROUTER_CONFIG_PATH],
        "ports": [{"name": "http", "containerPort": spec.router.port, "protocol": "TCP"}],
        "resources": resources,
        "volumeMounts": [{"name": "router-config", "mountPath": ROUTER_CONFIG_DIR,
                          "readOnly": True}],
        # /ready: 200 once an upstream of each tier the policy needs is healthy (the Service
        # sends traffic only then); /health: the process answers (a restart would not help an
        # unhealthy upstream).
        "readinessProbe": probe("http", "/ready", 5, 3),
        "livenessProbe": probe("http", "/health", 20, 3),
        "securityContext": {
            **(restricted_container_context() if root_pod else container_security_context()),
            "readOnlyRootFilesystem": True},
    }


def model_volume(spec: InferenceDeploymentSpec) -> tuple[list[dict], list[dict]]:
    volume = spec.model.volume
    if volume is None:
        return [], []
    source = ({"persistentVolumeClaim": {"claimName": volume.claim_name, "readOnly": True}}
              if volume.claim_name else {"hostPath": {"path": volume.host_path,
                                                      "type": "Directory"}})
    return ([{"name": "models", **source}],
            [{"name": "models", "mountPath": volume.mount_path, "readOnly": True}])


def shm_volume(size: str, name: str = "dshm") -> tuple[dict, dict]:
    """/dev/shm as a memory-backed emptyDir: the seeds' `--shm-size`."""
    return ({"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": size}},
            {"name": name, "mountPath": "/dev/shm"})
