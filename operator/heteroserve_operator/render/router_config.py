"""The router sidecar's configuration (a ConfigMap), in the shape of the sysHAX conductor's:
one accelerator upstream, CPU upstreams found through the headless decode Service."""

from __future__ import annotations

from typing import Any

import yaml

from ..api.models import InferenceDeploymentSpec
from . import meta
from .engines import EngineContainer
from .workloads import decode_name


def router_settings(spec: InferenceDeploymentSpec, owner: meta.Owner,
                    prefill: EngineContainer | None, decode: EngineContainer | None
                    ) -> dict[str, Any]:
    offload = spec.router.offload
    settings: dict[str, Any] = {
        "model": spec.model.name,
        "listen": {"host": "0.0.0.0", "port": spec.router.port},
        "policy": spec.router.policy,
        "requestTimeoutSeconds": spec.router.request_timeout_seconds,
        "offload": {"kvCacheUsageThreshold": offload.kv_cache_usage_threshold,
                    "minCpuTokensPerSecond": offload.min_cpu_tokens_per_second,
                    "cpuMaxBatchSize": offload.cpu_max_batch_size},
    }
    if prefill:
        settings["accelerator"] = _upstream(f"http://127.0.0.1:{prefill.port}", prefill)
    if decode:
        if spec.prefill is None:
            url = f"http://127.0.0.1:{decode.port}"  # the engine in the router's own pod
        else:
            url = (f"http://{decode_name(owner)}.{owner.namespace}.svc:{decode.port}")
        settings["cpu"] = {**_upstream(url, decode), "discovery": "dns"
                           if spec.prefill else "static"}
    return settings


def _upstream(url: str, engine: EngineContainer) -> dict[str, Any]:
    return {"url": url, "modelsPath": engine.models_path, "healthPath": engine.health_path,
            "metricsPath": engine.metrics_path}


def router_configmap(owner: meta.Owner, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta.metadata(owner, f"{owner.name}-router", "router"),
        "data": {"router.yaml": yaml.safe_dump(settings, sort_keys=True)},
    }


def engine_configmap(owner: meta.Owner, files: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta.metadata(owner, f"{owner.name}-engine", "prefill"),
        "data": dict(files),
    }
