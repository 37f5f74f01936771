"""vLLM-Ascend: `vllm serve` with the Ascend plugin on NPUs (same flags as vLLM)."""

from __future__ import annotations

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from . import EngineContainer, vllm


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    return vllm.prefill(spec, accelerator, default_image=images.VLLM_ASCEND)
