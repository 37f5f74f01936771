"""NVIDIA GPUs through the NVIDIA device plugin / GPU operator."""

from __future__ import annotations

from ...api.models import AcceleratorSpec
from . import AcceleratorProfile

RESOURCE = "nvidia.com/gpu"
# Label written by GPU feature discovery (GPU operator).
PRODUCT_LABEL = "nvidia.com/gpu.product"


def profile(accelerator: AcceleratorSpec) -> AcceleratorProfile:
    selector = {PRODUCT_LABEL: accelerator.product} if accelerator.product else {}
    return AcceleratorProfile(
        resource=RESOURCE,
        limits={RESOURCE: str(accelerator.count)},
        node_selector=selector,
        tolerations=[{"key": RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        torch_device="cuda",
    )
