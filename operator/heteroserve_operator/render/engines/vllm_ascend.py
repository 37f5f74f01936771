"""vLLM-Ascend: `vllm serve` with the Ascend plugin on NPUs (same flags as vLLM).

Runs as root with DAC_OVERRIDE (security.ASCEND_CANN: the image's CANN and the NPU driver's
device nodes); Pod Security "privileged", as the driver is mounted from the host anyway.
"""

from __future__ import annotations

from dataclasses import replace

from ...api.models import InferenceDeploymentSpec
from .. import images
from ..accelerators import AcceleratorProfile
from ..security import ASCEND_CANN
from . import EngineContainer, vllm


def prefill(spec: InferenceDeploymentSpec, accelerator: AcceleratorProfile) -> EngineContainer:
    return replace(vllm.prefill(spec, accelerator, default_image=images.VLLM_ASCEND),
                   security=ASCEND_CANN)
