"""The KV hand-off token: the per-deployment Secret `<name>-kv-token` (key `token`) that
authorizes pulling a request's KV from an engine (docs/kv-handoff.md, Security).

Only heteroserve's prefill engine paired with heteroserve's CPU engine hands KV over, so only such
deployments get one. Its value is random and made once, by the reconciler (create-if-absent): the
rendered children name the Secret and never hold its value, so a re-render cannot rotate it and
the value reaches no spec hash, log, Event or status.
"""

from __future__ import annotations

from typing import Any

from ..api.models import InferenceDeploymentSpec
from . import meta

TOKEN_KEY = "token"
MOUNT_DIR = "/etc/heteroserve/kv"
TOKEN_PATH = f"{MOUNT_DIR}/{TOKEN_KEY}"
VOLUME = "kv-token"
# r--r-----, root:fsGroup: the engine's non-root user reads it through the pod's fsGroup
# (security.pod_security_context); nobody else in the container does.
FILE_MODE = 0o440


def kv_handoff(spec: InferenceDeploymentSpec) -> bool:
    """Both tiers run heteroserve's engines: the only pair that can hand KV over (the other
    engines neither export nor import it; the router then sends requests whole)."""
    return bool(spec.prefill and spec.prefill.engine.kind == "builtin"
                and spec.decode and spec.decode.engine.kind == "builtin")


def engine_args(spec: InferenceDeploymentSpec) -> list[str]:
    """The flag of a builtin engine: without it the engine neither exports nor imports KV."""
    return ["--kv-token-file", TOKEN_PATH] if kv_handoff(spec) else []


# The prefill engine advertises its pod IP as the address to pull KV from: the router sidecar
# beside it reaches it on loopback, which a decode engine in another pod cannot use.
POD_IP_ENV = "POD_IP"


def export_args(spec: InferenceDeploymentSpec) -> list[str]:
    """The exporting (prefill) engine's flags beyond the token's."""
    return ["--kv-advertise-host", f"$({POD_IP_ENV})"] if kv_handoff(spec) else []


def export_env(spec: InferenceDeploymentSpec) -> dict[str, str]:
    """`POD_IP` from the downward API, for `export_args`."""
    return {POD_IP_ENV: "status.podIP"} if kv_handoff(spec) else {}


def secret_name(owner: meta.Owner) -> str:
    return f"{owner.name}-kv-token"


def volume(owner: meta.Owner) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod volume and the engine container's mount."""
    return ({"name": VOLUME, "secret": {"secretName": secret_name(owner),
                                        "defaultMode": FILE_MODE}},
            {"name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": True})


def secret(owner: meta.Owner, token: str) -> dict[str, Any]:
    """The Secret, for the reconciler to create once with a fresh `token`. Immutable: rotating
    is deleting it (the reconciler makes a new one) and restarting the engines."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
        "metadata": meta.metadata(owner, secret_name(owner), "kv-token"),
        "stringData": {TOKEN_KEY: token},
    }
