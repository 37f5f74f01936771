"""The router sidecar's configuration (a ConfigMap): a typed `RouterConfig`, the contract the
router loads (`heteroserve_engines.protocol.router_config`), in the shape of the sysHAX
conductor's: one accelerator upstream in the router's own pod, CPU upstreams found through the
headless decode Service (or, where the decode engine shares the prefill pod, in the router's own
pod too: render/same_node.py)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import yaml

from heteroserve_engines.protocol.router_config import Listen, Offload, RouterConfig, TierConfig

from ..api.models import InferenceDeploymentSpec
from . import meta, same_node
from .containers import ROUTER_CONFIG_FILE
from .engines import EngineContainer
from .workloads import decode_name

# libyaml's emitter where PyYAML was built with it (the wheels are): the same YAML as the pure
# Python SafeDumper for ASCII text (tests/unit/test_router_config_render.py; a long non-ASCII
# string is folded by one and not the other), 4.8x faster (timeit of one rendered router document
# on the 2-core VM: 0.21 ms against 0.99 ms), and every reconcile renders this document (the
# Python emitter was a twentieth of the operator's CPU while objects converged, in py-spy).
SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def router_settings(spec: InferenceDeploymentSpec, owner: meta.Owner,
                    prefill: EngineContainer | None, decode: EngineContainer | None
                    ) -> RouterConfig:
    offload = spec.router.offload
    accelerator = cpu = None
    if prefill:
        # The router is a sidecar in the prefill pod.
        accelerator = _tier(prefill, [f"http://127.0.0.1:{prefill.port}"],
                            max_concurrency=spec.prefill.engine.max_num_seqs,
                            kv_export=prefill.kv_token,
                            served_model_name=_served_name(spec, spec.prefill.engine.kind))
    if decode:
        if spec.prefill is None:  # CPU-only: the engine is in the router's own pod
            cpu = _tier(decode, [f"http://127.0.0.1:{decode.port}"],
                        max_concurrency=offload.cpu_max_batch_size, same_node=True,
                        served_model_name=_served_name(spec, spec.decode.engine.kind))
        elif same_node.shares_pod(spec):  # the decode engine beside the router's prefill engine
            cpu = _tier(decode, [f"http://127.0.0.1:{decode.port}"],
                        max_concurrency=offload.cpu_max_batch_size, kv_import=decode.kv_token,
                        same_node=True,
                        served_model_name=_served_name(spec, spec.decode.engine.kind))
        else:  # every decode pod, through the headless Service's DNS records
            cpu = _tier(decode,
                        [f"http://{decode_name(owner)}.{owner.namespace}.svc:{decode.port}"],
                        discovery="dns", max_concurrency=offload.cpu_max_batch_size,
                        kv_import=decode.kv_token,
                        same_node=spec.decode.placement == "sameNode",
                        served_model_name=_served_name(spec, spec.decode.engine.kind))
    return RouterConfig(
        model=spec.model.name,
        listen=Listen(host="0.0.0.0", port=spec.router.port),
        policy=spec.router.policy,
        request_timeout_seconds=spec.router.request_timeout_seconds,
        offload=Offload(kv_cache_usage_threshold=offload.kv_cache_usage_threshold,
                        min_cpu_tokens_per_second=offload.min_cpu_tokens_per_second,
                        cpu_max_batch_size=offload.cpu_max_batch_size),
        accelerator=accelerator,
        cpu=cpu,
    )


def _tier(engine: EngineContainer, urls: list[str], *,
          max_concurrency: int | None, served_model_name: str | None,
          discovery: str = "static", same_node: bool = False,
          kv_export: bool = False, kv_import: bool = False) -> TierConfig:
    """`kv_export`/`kv_import`: this tier's engines take their side of a split (they hold the
    deployment's KV token: heteroserve's own pair only). Without both the router sends requests
    whole."""
    fields: dict[str, Any] = {
        "urls": urls, "discovery": discovery, "models_path": engine.models_path,
        "health_path": engine.health_path, "metrics_path": engine.metrics_path,
        "same_node": same_node, "served_model_name": served_model_name,
        "kv_export": kv_export, "kv_import": kv_import,
    }
    if max_concurrency:
        fields["max_concurrency"] = max_concurrency
    return TierConfig(**fields)


def _served_name(spec: InferenceDeploymentSpec, engine_kind: str) -> str | None:
    """The name an engine serves the model under, where it is not `spec.model.name` (the other
    engines are started with `--served-model-name`)."""
    served = {
        # The Gaudi start script has no served-name flag: vLLM serves the weights path (seed 003's
        # curl sends `"model": "/data/hf_models/DeepSeek-R1-0528-G2"`).
        "vllm-gaudi": spec.model.path,
        # The sysInfer server is given only the GGUF file; seed 002's client sends its stem.
        "sysinfer": PurePosixPath(spec.model.path).stem,
    }.get(engine_kind)
    return served if served and served != spec.model.name else None


def router_configmap(owner: meta.Owner, config: RouterConfig) -> dict[str, Any]:
    # Nulls are kept: `healthPath: null` left out would load back as the default /health, and
    # KsanaLLM has no such route.
    document = config.document()
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta.metadata(owner, f"{owner.name}-router", "router"),
        "data": {ROUTER_CONFIG_FILE: yaml.dump(document, Dumper=SAFE_DUMPER, sort_keys=True)},
    }


def engine_configmap(owner: meta.Owner, files: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta.metadata(owner, f"{owner.name}-engine", "prefill"),
        "data": dict(files),
    }
