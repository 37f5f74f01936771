"""All desired children of one InferenceDeployment: `render(spec, owner, facts)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.models import InferenceDeploymentSpec
from . import kv_token, meta, same_node
from .accelerators import profile as accelerator_profile
from .engines import (
    EngineContainer,
    builtin,
    ksana,
    sysinfer,
    vllm,
    vllm_ascend,
    vllm_cpu,
    vllm_gaudi,
)
from .facts import ClusterFacts
from .networking import decode_service, disruption_budget, ingress, router_service
from .placement import DecodePlacement, place_decode
from .router_config import engine_configmap, router_configmap, router_settings
from .workloads import decode_deployment, prefill_deployment

PREFILL_ENGINES = {"vllm": vllm, "vllm-gaudi": vllm_gaudi, "vllm-ascend": vllm_ascend,
                   "ksana": ksana, "builtin": builtin}
DECODE_ENGINES = {"builtin": builtin, "vllm-cpu": vllm_cpu, "sysinfer": sysinfer}


@dataclass(frozen=True)
class Rendered:
    children: list[dict[str, Any]]
    placement: DecodePlacement | None
    endpoint: str
    # The KV token Secret the engine pods mount, which the reconciler creates once (its value is
    # never rendered: render/kv_token.py); None when no engine hands KV over.
    kv_token_secret: str | None = None


def possible_children(name: str) -> tuple[tuple[str, str, str], ...]:
    """Every (apiVersion, kind, name) a render of `name` can produce: what the reconciler reads
    and, when no longer desired, prunes."""
    return (
        ("v1", "ConfigMap", f"{name}-router"),
        ("v1", "ConfigMap", f"{name}-engine"),
        ("v1", "Service", name),
        ("v1", "Service", f"{name}-decode"),
        ("apps/v1", "Deployment", f"{name}-prefill"),
        ("apps/v1", "Deployment", f"{name}-decode"),
        ("policy/v1", "PodDisruptionBudget", f"{name}-prefill"),
        ("policy/v1", "PodDisruptionBudget", f"{name}-decode"),
        ("networking.k8s.io/v1", "Ingress", name),
    )


def prefill_engine(spec: InferenceDeploymentSpec) -> EngineContainer | None:
    if spec.prefill is None:
        return None
    accel = accelerator_profile(spec.prefill.accelerator)
    return PREFILL_ENGINES[spec.prefill.engine.kind].prefill(spec, accel)


def render(spec: InferenceDeploymentSpec, owner: meta.Owner, facts: ClusterFacts) -> Rendered:
    """Raises NumaPlanError when the decode request cannot be placed by the seeds' rules."""
    prefill = prefill_engine(spec)
    placement = place_decode(spec, facts) if spec.decode else None
    decode = (DECODE_ENGINES[spec.decode.engine.kind].decode(spec, placement.plan)
              if spec.decode else None)

    router_cm = router_configmap(owner, router_settings(spec, owner, prefill, decode))
    children: list[dict[str, Any]] = [router_cm]
    engine_cm = None
    if prefill and prefill.config_files:
        engine_cm = engine_configmap(owner, prefill.config_files)
        children.append(engine_cm)
    config_hash = meta.digest([router_cm["data"], engine_cm["data"] if engine_cm else None])
    children.append(router_service(spec, owner))
    shared_pod = same_node.shares_pod(spec)
    if prefill:
        children.append(prefill_deployment(spec, owner, prefill, config_hash,
                                           *((decode, placement) if shared_pod else ())))
        if spec.prefill.replicas > 1:
            children.append(disruption_budget(owner, "prefill"))
    if decode and not shared_pod:
        children.append(decode_service(owner, decode.port))
        children.append(decode_deployment(spec, owner, decode, placement, config_hash))
        if spec.decode.replicas > 1:
            children.append(disruption_budget(owner, "decode"))
    if spec.ingress.enabled:
        children.append(ingress(spec, owner))
    endpoint = (f"http://{owner.name}.{owner.namespace}.svc:{spec.service.port}/v1")
    token = any(engine and engine.kv_token for engine in (prefill, decode))
    return Rendered([meta.with_spec_hash(c) for c in children], placement, endpoint,
                    kv_token.secret_name(owner) if token else None)
