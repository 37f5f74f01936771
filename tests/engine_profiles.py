"""One InferenceDeployment per engine profile, with the Pod Security level each of its pods
needs: what docs/security.md states, checked by the renderer's unit tests and by the real
apiserver's Pod Security admission (tests/integration/test_pod_security_profiles.py).

The model is on a PersistentVolumeClaim, so a level above "restricted" comes from the engine
profile (or, on Ascend, the driver the accelerator profile mounts from the host), not from a
hostPath model volume: that one makes any pod "privileged".
"""

from __future__ import annotations

from typing import Any

from heteroserve_operator.api import InferenceDeploymentSpec

MODEL = {"name": "m", "path": "/models/m", "volume": {"claimName": "models",
                                                      "mountPath": "/models"}}


def _spec(prefill: dict[str, Any] | None, decode: dict[str, Any] | None,
          policy: str) -> InferenceDeploymentSpec:
    document: dict[str, Any] = {"model": MODEL, "decode": decode, "router": {"policy": policy}}
    if prefill:
        document["prefill"] = prefill
    return InferenceDeploymentSpec.model_validate(document)


def _prefill(kind: str, accelerator: str, count: int = 1, **engine) -> dict[str, Any]:
    return {"accelerator": {"type": accelerator, "count": count},
            "engine": {"kind": kind, **engine}}


# profile -> (spec, {Deployment suffix: the Pod Security level its pods need}).
PROFILES: dict[str, tuple[InferenceDeploymentSpec, dict[str, str]]] = {
    "builtin": (_spec(_prefill("builtin", "nvidia"), {"cpus": 4}, "auto"),
                {"prefill": "restricted", "decode": "restricted"}),
    "vllm": (_spec(_prefill("vllm", "nvidia"), None, "accelerator"),
             {"prefill": "restricted"}),
    # sysHAX's CPU vLLM: seccomp Unconfined for its NUMA binding (migrate_pages).
    "vllm-cpu": (_spec(None, {"cpus": 4, "numaNodes": 1, "engine": {"kind": "vllm-cpu"}}, "cpu"),
                 {"decode": "privileged"}),
    "sysinfer": (_spec(None, {"cpus": 4, "numaNodes": 1, "engine": {"kind": "sysinfer"}}, "cpu"),
                 {"decode": "restricted"}),
    # Root with SYS_NICE (not on baseline's list), without the recipe cache's hostPath.
    "vllm-gaudi": (_spec(_prefill("vllm-gaudi", "gaudi", 4), None, "accelerator"),
                   {"prefill": "privileged"}),
    # Root, no capability added: baseline.
    "ksana-nvidia": (_spec(_prefill("ksana", "nvidia", 2), None, "accelerator"),
                     {"prefill": "baseline"}),
    # Root with DAC_OVERRIDE (baseline's list), but the Ascend driver is mounted from the host.
    "ksana-ascend": (_spec(_prefill("ksana", "ascend", 8), None, "accelerator"),
                     {"prefill": "privileged"}),
    "vllm-ascend": (_spec(_prefill("vllm-ascend", "ascend", 1), None, "accelerator"),
                    {"prefill": "privileged"}),
}
