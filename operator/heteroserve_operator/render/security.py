"""Pod and container security contexts: Pod Security "restricted" unless a profile needs more."""

from __future__ import annotations

from typing import Any

# Non-root UID/GID used by heteroserve's images (and a safe default for vLLM images run non-root).
RUN_AS_USER = 1000


def pod_security_context() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(add_capabilities: tuple[str, ...] = ()) -> dict[str, Any]:
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add_capabilities:
        capabilities["add"] = list(add_capabilities)
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
            "capabilities": capabilities}
