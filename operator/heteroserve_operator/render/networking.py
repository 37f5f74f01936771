"""The Service in front of the routers, the headless decode Service, the Ingress and the
PodDisruptionBudgets."""

from __future__ import annotations

from typing import Any

from ..api.models import InferenceDeploymentSpec
from . import meta
from .workloads import SERVING_LABEL, decode_name, prefill_name


def router_service(spec: InferenceDeploymentSpec, owner: meta.Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta.metadata(owner, owner.name, "router"),
        "spec": {
            "type": spec.service.type,
            "selector": {meta.LABEL_INSTANCE: owner.name, SERVING_LABEL: "true"},
            "ports": [{"name": "http", "port": spec.service.port, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }


def decode_service(owner: meta.Owner, port: int) -> dict[str, Any]:
    """Headless: the routers resolve every decode pod's address through DNS."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta.metadata(owner, decode_name(owner), "decode"),
        "spec": {
            "clusterIP": "None",
            "selector": meta.selector(owner, "decode"),
            "ports": [{"name": "engine", "port": port, "targetPort": "engine",
                       "protocol": "TCP"}],
        },
    }


def ingress(spec: InferenceDeploymentSpec, owner: meta.Owner) -> dict[str, Any]:
    rule: dict[str, Any] = {"http": {"paths": [{
        "path": "/", "pathType": "Prefix",
        "backend": {"service": {"name": owner.name, "port": {"name": "http"}}}}]}}
    if spec.ingress.host:
        rule["host"] = spec.ingress.host
    body: dict[str, Any] = {"rules": [rule]}
    if spec.ingress.class_name:
        body["ingressClassName"] = spec.ingress.class_name
    if spec.ingress.tls_secret_name:
        body["tls"] = [{"secretName": spec.ingress.tls_secret_name,
                        **({"hosts": [spec.ingress.host]} if spec.ingress.host else {})}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": meta.metadata(owner, owner.name, "router"), "spec": body}


def disruption_budget(owner: meta.Owner, component: str) -> dict[str, Any]:
    name = prefill_name(owner) if component == "prefill" else decode_name(owner)
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta.metadata(owner, name, component),
        "spec": {"maxUnavailable": 1,
                 "selector": {"matchLabels": meta.selector(owner, component)}},
    }
