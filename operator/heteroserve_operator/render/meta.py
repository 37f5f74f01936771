"""Names, labels, owner references and the spec hash shared by every child."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..api.models import GROUP, KIND, VERSION

FIELD_MANAGER = "heteroserve-operator"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_OWNER = "heteroserve.io/inference-deployment"
MANAGED_BY = {"app.kubernetes.io/managed-by": FIELD_MANAGER}
SPEC_HASH = "heteroserve.io/spec-hash"
CONFIG_HASH = "heteroserve.io/config-hash"
NUMA_PLAN = "heteroserve.io/numa-plan"


@dataclass(frozen=True)
class Owner:
    """The InferenceDeployment a child belongs to."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}


def selector(owner: Owner, component: str) -> dict[str, str]:
    """Immutable Deployment selector labels."""
    return {LABEL_INSTANCE: owner.name, LABEL_COMPONENT: component}


def labels(owner: Owner, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "heteroserve", **selector(owner, component),
            LABEL_OWNER: owner.name, **MANAGED_BY}


def metadata(owner: Owner, name: str, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": owner.namespace, "labels": labels(owner, component),
            "ownerReferences": [owner.reference()], **extra}


def digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()[:16]


def with_spec_hash(manifest: dict[str, Any]) -> dict[str, Any]:
    """Stamps the manifest's own hash, so the reconciler detects drift without a diff."""
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations.pop(SPEC_HASH, None)
    annotations[SPEC_HASH] = digest(manifest)
    return manifest
