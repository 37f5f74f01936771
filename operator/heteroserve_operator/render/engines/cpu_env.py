"""The environment every CPU decode engine gets: the NUMA plan plus the seeds' knobs."""

from __future__ import annotations

from ...api.models import DecodeSpec
from ...numa import NumaPlan

# Kunpeng guidance (sysHAX): q4_0 with NRC=4, q8_0 with NRC=2.
DEFAULT_NRC = {"q4_0": 4, "q8_0": 2}


def decode_environment(decode: DecodeSpec, plan: NumaPlan, *,
                       guided_nrc: bool = True) -> dict[str, str]:
    """`guided_nrc`: when gemv_tiling is unset, pass the Kunpeng guidance as NRC (the engines
    tuned by it); otherwise NRC is set only when the spec sets it."""
    env = {
        # Enables the fused CPU path; OMP_NUM_THREADS only counts with it (sysHAX).
        "INFERENCE_OP_MODE": "fused",
        **plan.environment(),
        "SYSHAX_QUANTIZE": decode.quantization,
    }
    nrc = decode.gemv_tiling or (DEFAULT_NRC[decode.quantization] if guided_nrc else None)
    if nrc:
        env["NRC"] = str(nrc)
    return env
