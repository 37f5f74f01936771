"""Accelerator profiles: what a pod needs to use one family of cards.

One module per family; each exposes `profile(accelerator) -> AcceleratorProfile`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...api.models import AcceleratorSpec


@dataclass(frozen=True)
class AcceleratorProfile:
    resource: str                       # the device plugin's extended resource
    limits: dict[str, str]              # extended resources (and hugepages) per pod
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    capabilities: tuple[str, ...] = ()
    torch_device: str = "cuda"


def profile(accelerator: AcceleratorSpec) -> AcceleratorProfile:
    from . import ascend, gaudi, nvidia

    return {"nvidia": nvidia, "ascend": ascend, "gaudi": gaudi}[accelerator.type].profile(
        accelerator)
