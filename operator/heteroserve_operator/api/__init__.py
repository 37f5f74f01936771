"""The InferenceDeployment API (heteroserve.io/v1alpha1): pydantic models, the single source of
truth from which the CRD schema, the chart's copy and the reference docs are generated."""

from .models import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    AcceleratorSpec,
    DecodeEngineSpec,
    DecodeSpec,
    InferenceDeploymentSpec,
    ModelSpec,
    PrefillEngineSpec,
    PrefillSpec,
    RouterSpec,
)

__all__ = [
    "GROUP", "KIND", "PLURAL", "VERSION", "AcceleratorSpec", "DecodeEngineSpec", "DecodeSpec",
    "InferenceDeploymentSpec", "ModelSpec", "PrefillEngineSpec", "PrefillSpec", "RouterSpec",
]
