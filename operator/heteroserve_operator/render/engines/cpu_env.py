"""The environment of the CPU decode engines: the NUMA plan's binding, plus sysHAX's knobs for the
engines that read them (sysHAX's CPU vLLM and heteroserve's CPU engine; not sysInfer)."""

from __future__ import annotations

from ...api.models import DecodeSpec
from ...numa import NumaPlan

# Kunpeng guidance (sysHAX): q4_0 with NRC=4, q8_0 with NRC=2.
DEFAULT_NRC = {"q4_0": 4, "q8_0": 2}


def binding_environment(plan: NumaPlan) -> dict[str, str]:
    """The CPU binding alone (OMP_NUM_THREADS and the affinity lists): what sysInfer, which
    has no fused sysHAX path, quantization on load or NRC, reads."""
    return plan.environment()


def decode_environment(decode: DecodeSpec, plan: NumaPlan, *,
                       guided_nrc: bool = True) -> dict[str, str]:
    """`guided_nrc`: when gemv_tiling is unset, pass the Kunpeng guidance as NRC (the engines
    tuned by it); otherwise NRC is set only when the spec sets it."""
    env = {
        # Enables the fused CPU path; OMP_NUM_THREADS only counts with it (sysHAX).
        "INFERENCE_OP_MODE": "fused",
        **binding_environment(plan),
        "SYSHAX_QUANTIZE": decode.quantization,
    }
    nrc = decode.gemv_tiling or (DEFAULT_NRC[decode.quantization] if guided_nrc else None)
    if nrc:
        env["NRC"] = str(nrc)
    return env
