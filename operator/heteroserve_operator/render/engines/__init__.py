"""Engine profiles: the exact command line, environment and files of each engine.

One module per engine; prefill engines expose `prefill(spec, accelerator) -> EngineContainer`,
CPU decode engines `decode(spec, plan) -> EngineContainer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..security import RESTRICTED, SecurityProfile


@dataclass(frozen=True)
class EngineContainer:
    image: str
    command: list[str]
    args: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    # Variables from the pod's own fields (the downward API): name -> fieldPath.
    field_env: dict[str, str] = field(default_factory=dict)
    # Path answering 200 once the model is loaded; None: a TCP check.
    health_path: str | None = "/health"
    # Where the engine lists its models (KsanaLLM: /models, without /v1).
    models_path: str = "/v1/models"
    metrics_path: str | None = "/metrics"
    # Longest expected start (model load, Gaudi warmup), for the startup probe.
    startup_seconds: int = 1800
    working_dir: str | None = None
    # Files rendered into a ConfigMap and mounted at config_dir.
    config_files: dict[str, str] = field(default_factory=dict)
    config_dir: str = "/etc/heteroserve/engine"
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    shm_size: str = "64Gi"
    # Mounts the deployment's KV token (render/kv_token.py) and hands KV over with it: exports
    # as a prefill engine, imports as a decode engine. Only heteroserve's own pair does.
    kv_token: bool = False
    # The engine container's user, capabilities and seccomp profile (render/security.py):
    # restricted unless the engine's image needs more, with the reason.
    security: SecurityProfile = RESTRICTED
    # Node labels the engine's image requires (an architecture it is built for).
    node_selector: dict[str, str] = field(default_factory=dict)
    # Containers that run before the engine in its pod (render/engines/bind_wrapper.py).
    init_containers: list[dict[str, Any]] = field(default_factory=list)


PREFILL_PORT = 8001
DECODE_PORT = 8002


def user_env(entries) -> dict[str, str]:
    return {entry.name: entry.value for entry in entries}
