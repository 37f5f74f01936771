"""InferenceDeployment spec and status.

Every field carries a description: it becomes `kubectl explain` text. Cross-field rules are CEL
(`x-kubernetes-validations`) so that the apiserver rejects bad specs at `kubectl apply`; the same
rules are checked in Python (`InferenceDeploymentSpec` validators) for local mode, which has no
apiserver.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from heteroserve_engines.protocol.binding import (
    BINDING_VARIABLES,
    INFERENCE_OP_MODE,
    NRC,
    SYSHAX_QUANTIZE,
)

from .quantity import parse_quantity

GROUP = "heteroserve.io"
VERSION = "v1alpha1"
KIND = "InferenceDeployment"
PLURAL = "inferencedeployments"
SINGULAR = "inferencedeployment"
SHORT_NAMES = ["infd"]

QUANTITY_PATTERN = r"^(\d+(\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# In the CRD, an object with all-defaulted fields defaults to {} so the apiserver fills it in.
OBJECT_DEFAULT = {"default": {}}
# Lists the CEL rules iterate over are bounded, so the apiserver can bound the rules' cost.
MAX_ENV = 128
MAX_ARGS = 256
# Upper bounds of the engines' sizes: far above any seed, low enough that a typo is refused.
MAX_TOKENS = 1048576          # context, bucket and warmup lengths
MAX_BATCHED_TOKENS = 16777216  # tokens per engine step
MAX_SEQS = 65536               # concurrent sequences

# The children are named `<name>` and `<name><suffix>` (render/children.py, render/kv_token.py);
# Services need DNS-1035 labels of at most 63 characters, and every child name stays one.
CHILD_NAME_SUFFIXES = ("-prefill", "-decode", "-router", "-engine", "-kv-token")
DNS_LABEL_MAX = 63
MAX_NAME_LENGTH = DNS_LABEL_MAX - max(map(len, CHILD_NAME_SUFFIXES))
DNS_1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"

# The environment of the CPU decode engines that the operator sets (render/engines/cpu_env.py):
# the binding follows decode.cpus and decode.numaNodes (threads = bound CPUs), quantization and
# NRC follow decode.quantization and decode.gemvTiling. A user entry would override them.
OPERATOR_DECODE_ENV = (*BINDING_VARIABLES, INFERENCE_OP_MODE, SYSHAX_QUANTIZE, NRC)

AcceleratorType = Literal["nvidia", "ascend", "gaudi"]
PrefillEngineKind = Literal["vllm", "vllm-gaudi", "vllm-ascend", "ksana", "builtin"]
DecodeEngineKind = Literal["builtin", "vllm-cpu", "sysinfer"]
Quantization = Literal["q8_0", "q4_0"]
Dtype = Literal["auto", "half", "float16", "bfloat16", "float32"]
# The Gaudi start scripts of seed 003: scripts/start_gaudi_vllm_server.sh (sections 2-3.2) and the
# deepseek_r1 branch's quickstart/start_vllm.sh (section 3.1, DeepSeek-R1 FP8 on 8 cards).
GaudiScript = Literal["start_gaudi_vllm_server", "start_vllm"]
# start_vllm.sh: "maximal value for single node: 32768".
START_VLLM_MAX_MODEL_LEN = 32768


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    @classmethod
    def cel_rules(cls) -> list[dict[str, str]]:
        return list(
            cls.model_config.get("json_schema_extra", {}).get(  # type: ignore[union-attr]
                "x-kubernetes-validations", []
            )
        )


def field_rule(rule: str, message: str, check: Callable[[Any], bool]) -> tuple[Any, Any]:
    """A CEL rule on one field (`Annotated[type, *field_rule(...)]`) and its Python mirror for
    local mode, which refuses the value with the same message."""

    def validate(value: Any) -> Any:
        if not check(value):
            raise ValueError(message)
        return value

    return (Field(json_schema_extra={"x-kubernetes-validations": [cel(rule, message)]}),
            AfterValidator(validate))


def absolute_path(field: str) -> Any:
    """A path that must start with '/'."""
    return Annotated[str, Field(max_length=4096), *field_rule(
        "self.startsWith('/')", f"{field} must be an absolute path (starting with /)",
        lambda value: value.startswith("/"))]


def bounded_quantity(field: str, low: str, high: str) -> Any:
    """A quantity between `low` and `high`: the apiserver would clamp a huge one (999999999Ei)
    in the pod and leave it Pending with no word why."""
    low_value, high_value = parse_quantity(low), parse_quantity(high)
    return Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32), *field_rule(
        f"quantity(self).compareTo(quantity('{low}')) >= 0 && "
        f"quantity(self).compareTo(quantity('{high}')) <= 0",
        f"{field} must be between {low} and {high}",
        lambda value: low_value <= parse_quantity(value) <= high_value)]


def rules(*entries: dict[str, str]) -> ConfigDict:
    return ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        json_schema_extra={"x-kubernetes-validations": list(entries)},
    )


class EnvVar(ApiModel):
    """An environment variable set in the engine container."""

    name: Annotated[
        str, Field(description="Variable name.", pattern=ENV_NAME_PATTERN, max_length=256)
    ]
    value: Annotated[str, Field(description="Variable value.", max_length=4096)] = ""


class ModelVolume(ApiModel):
    """Where the model files live; mounted read-only into every engine container."""

    model_config = rules(
        cel(
            "has(self.claimName) != has(self.hostPath)",
            "model.volume needs exactly one of claimName and hostPath",
        )
    )

    claim_name: str | None = Field(
        default=None, description="Name of a PersistentVolumeClaim in the same namespace."
    )
    host_path: absolute_path("model.volume.hostPath") | None = Field(
        default=None, description="A directory on the node (the seeds' `-v /home/models:...`)."
    )
    mount_path: absolute_path("model.volume.mountPath") = Field(
        default="/models", description="Where the volume is mounted in the containers."
    )


class ModelSpec(ApiModel):
    """The model served, identical for prefill and decode."""

    name: str = Field(
        description="Served model name: the `model` field clients send (vLLM "
        "`--served-model-name`).",
        min_length=1,
        max_length=253,
    )
    path: absolute_path("model.path") = Field(
        description="Absolute path of the weights inside the containers (a directory, or a "
        "GGUF file for CPU engines).",
        min_length=1,
    )
    volume: ModelVolume | None = Field(default=None, description="Volume holding the weights.")
    max_model_len: int = Field(
        default=8192,
        ge=16,
        le=MAX_TOKENS,
        description="Maximum context length in tokens (prompt + completion).",
    )
    dtype: Dtype = Field(default="auto", description="Accelerator compute dtype (vLLM `--dtype`).")


class AcceleratorSpec(ApiModel):
    """The accelerator cards of one prefill replica."""

    model_config = rules(
        cel(
            "!has(self.moduleIds) || self.type == 'gaudi'",
            "accelerator.moduleIds applies to Gaudi only",
        ),
        cel(
            "!has(self.moduleIds) || size(self.moduleIds) == self.count",
            "accelerator.moduleIds must list exactly `count` Gaudi module IDs",
        ),
    )

    type: AcceleratorType = Field(description="Accelerator family.")
    count: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Cards per replica; the engine's tensor-parallel size.",
    )
    product: str | None = Field(
        default=None,
        description="Only nodes whose product label matches (e.g. NVIDIA-A100-SXM4-80GB, 910B2C).",
    )
    module_ids: list[Annotated[int, Field(ge=0, le=7)]] | None = Field(
        default=None,
        max_length=8,
        description="Gaudi module IDs (the start script's `-m`), preferably on one NUMA node.",
    )


class TokenRange(ApiModel):
    """An inclusive token-count range."""

    model_config = rules(cel("self.min <= self.max", "range min must not exceed max"))

    min: int = Field(ge=1, le=MAX_TOKENS, description="Smallest count.")
    max: int = Field(ge=1, le=MAX_TOKENS, description="Largest count.")


class GaudiWarmup(ApiModel):
    """Gaudi graph warmup and its recipe cache (the start script's -c, -s, -r)."""

    recipe_cache: bool = Field(
        default=True,
        description="Keep compiled HPU recipes on a node-local volume keyed by model, engine "
        "configuration and image, so later starts skip recompiling (`-c`).",
    )
    recipe_cache_path: absolute_path("prefill.engine.warmup.recipeCachePath") = Field(
        default="/data/warmup_cache", description="Where the cache is mounted."
    )
    skip: bool = Field(default=False, description="Skip warmup (`-s`); needs a warm cache.")
    reduced_max_batch_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SEQS,
        description="Warm only up to this batch size (`-r`, with maxSeqLen).",
    )
    reduced_max_seq_len: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS,
        description="Warm only up to this sequence length (`-r`).",
    )


class PrefillEngineSpec(ApiModel):
    """The accelerator engine and its settings."""

    kind: PrefillEngineKind = Field(description="Which engine serves on the accelerator.")
    image: str | None = Field(default=None, description="Container image; a per-kind default.")
    port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="Engine HTTP port; default 8001 (Gaudi: 30001, Gaudi start_vllm: 8688).",
    )
    script: GaudiScript | None = Field(
        default=None,
        description="vllm-gaudi: the start script. start_gaudi_vllm_server (default): "
        "scripts/start_gaudi_vllm_server.sh of vllm-fork; start_vllm: quickstart/start_vllm.sh "
        "of vllm-fork's deepseek_r1 branch, DeepSeek-R1 FP8 on all 8 cards of a node, which "
        "takes only `-w -u -p -l -b -c -s -q` (model.maxModelLen, maxNumSeqs, warmup.recipeCache, "
        "warmup.skip, quantization) and needs an image with that branch, vllm-hpu-extension and "
        "the model's measurement files.",
    )
    quantization: Literal["inc-fp8"] | None = Field(
        default=None,
        description="Quantize on load. inc-fp8: Intel Neural Compressor FP8 (Gaudi start_vllm "
        "`-q`).",
    )
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Extra engine arguments."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=MAX_ENV, description="Extra environment."
    )
    block_size: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="KV-cache block size in tokens (vLLM `--block_size`, "
        "KsanaLLM `block_token_num`); sysHAX needs 16 on both tiers.",
    )
    swap_space: int | None = Field(
        default=None, ge=0, le=16384, description="CPU swap space in GiB (vLLM `--swap_space`)."
    )
    preemption_mode: Literal["swap", "recompute"] | None = Field(
        default=None, description="vLLM `--preemption_mode`; sysHAX uses swap."
    )
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0, le=1, description="vLLM `--gpu_memory_utilization`."
    )
    max_num_seqs: int | None = Field(
        default=None,
        ge=1,
        le=MAX_SEQS,
        description="Maximum concurrent sequences (Gaudi `-b`, KsanaLLM `max_batch_size`).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCHED_TOKENS,
        description="Maximum tokens per step (Gaudi `-t`).",
    )
    input_range: TokenRange | None = Field(
        default=None, description="Gaudi bucketing: prompt lengths to warm up (`-i`)."
    )
    output_range: TokenRange | None = Field(
        default=None, description="Gaudi bucketing: completion lengths to warm up (`-o`)."
    )
    warmup: GaudiWarmup | None = Field(default=None, description="Gaudi warmup settings.")
    shm_size: bounded_quantity("prefill.engine.shmSize", "1Mi", "16Ti") | None = Field(
        default=None,
        description="Size of the memory-backed /dev/shm (the seeds' `--shm-size`); default 64Gi "
        "for vLLM engines, 50Gi for KsanaLLM, 8Gi for the builtin prefill engine.",
    )


class PrefillSpec(ApiModel):
    """Accelerator pods that prefill (and decode what is not offloaded)."""

    model_config = rules(
        cel(
            "self.engine.kind != 'vllm-gaudi' || self.accelerator.type == 'gaudi'",
            "engine vllm-gaudi needs accelerator type gaudi",
        ),
        cel(
            "self.engine.kind != 'vllm-ascend' || self.accelerator.type == 'ascend'",
            "engine vllm-ascend needs accelerator type ascend",
        ),
        cel(
            "self.engine.kind != 'vllm' || self.accelerator.type == 'nvidia'",
            "engine vllm needs accelerator type nvidia (use vllm-gaudi or vllm-ascend)",
        ),
        cel(
            "self.engine.kind != 'ksana' || self.accelerator.type != 'gaudi'",
            "engine ksana runs on nvidia or ascend, not gaudi",
        ),
        cel(
            "!has(self.engine.warmup) || self.accelerator.type == 'gaudi'",
            "engine.warmup applies to Gaudi only",
        ),
        cel(
            "!has(self.engine.script) || self.engine.kind == 'vllm-gaudi'",
            "engine.script applies to engine vllm-gaudi only",
        ),
        cel(
            "!has(self.engine.quantization) || "
            "(has(self.engine.script) && self.engine.script == 'start_vllm')",
            "engine.quantization inc-fp8 needs engine.script start_vllm (the only Gaudi script "
            "with -q)",
        ),
        cel(
            "!has(self.engine.script) || self.engine.script != 'start_vllm' || "
            "self.accelerator.count == 8",
            "engine.script start_vllm runs on all 8 cards of a Gaudi node: accelerator.count "
            "must be 8",
        ),
        cel(
            "!has(self.engine.script) || self.engine.script != 'start_vllm' || "
            "has(self.engine.image)",
            "engine.script start_vllm needs engine.image: an image with vllm-fork's deepseek_r1 "
            "branch, vllm-hpu-extension and the model's measurement files",
        ),
        cel(
            "!has(self.engine.script) || self.engine.script != 'start_vllm' || "
            "!(has(self.accelerator.moduleIds) || has(self.engine.inputRange) || "
            "has(self.engine.outputRange) || has(self.engine.maxNumBatchedTokens) || "
            "(has(self.engine.warmup) && (has(self.engine.warmup.reducedMaxBatchSize) || "
            "has(self.engine.warmup.reducedMaxSeqLen))))",
            "engine.script start_vllm takes no accelerator.moduleIds, inputRange, outputRange, "
            "maxNumBatchedTokens or reduced warmup (it has no -m, -i, -o, -t or -r)",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=1000, description="Prefill pods.")
    accelerator: AcceleratorSpec = Field(description="Accelerator cards per pod.")
    engine: PrefillEngineSpec = Field(description="Engine on the accelerator.")
    memory: bounded_quantity("prefill.memory", "64Mi", "16Ti") = Field(
        default="64Gi",
        description="Host memory request and limit of the engine container.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node selector.")


class DecodeEngineSpec(ApiModel):
    """The CPU engine that continues decoding offloaded requests."""

    model_config = rules(
        cel(
            "!has(self.env) || !self.env.exists(e, e.name in ["
            + ", ".join(f"'{name}'" for name in OPERATOR_DECODE_ENV) + "])",
            "decode.engine.env may not set " + ", ".join(OPERATOR_DECODE_ENV) + ": the "
            "operator sets them (the CPU binding from decode.cpus and decode.numaNodes, with "
            "threads = bound CPUs; quantization and NRC from decode.quantization and "
            "decode.gemvTiling)",
        ),
    )

    kind: DecodeEngineKind = Field(
        default="builtin",
        description="builtin: heteroserve's CPU engine; vllm-cpu: the sysHAX "
        "CPU vLLM image; sysinfer: the sysInfer openai server.",
    )
    image: str | None = Field(default=None, description="Container image; a per-kind default.")
    port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="Engine HTTP port; default 8002 (sysinfer: 7860).",
    )
    args: list[str] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Extra engine arguments."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Extra environment; not the variables the operator sets ("
        + ", ".join(OPERATOR_DECODE_ENV) + ").",
    )


class DecodeSpec(ApiModel):
    """NUMA-pinned CPU decode pods (Guaranteed QoS, integer CPUs, exclusive cores)."""

    model_config = rules(
        cel(
            "!has(self.numaNodes) || self.cpus % self.numaNodes == 0",
            "decode.cpus must be a multiple of decode.numaNodes: the thread count equals the "
            "bound CPUs and every NUMA node contributes the same number of CPUs",
        ),
        cel(
            "!has(self.gemvTiling) || self.engine.kind != 'sysinfer'",
            "decode.gemvTiling (NRC) is a sysHAX/heteroserve setting; sysinfer ignores it",
        ),
    )

    replicas: int = Field(default=1, ge=0, le=1000, description="Decode pods.")
    placement: Literal["sameNode", "anyNode"] = Field(
        default="anyNode",
        description="sameNode: on the prefill nodes, using their host cores "
        "(sysHAX); anyNode: on any node with enough CPUs.",
    )
    cpus: int = Field(ge=1, le=1024, description="CPUs per pod; equals the engine threads.")
    numa_nodes: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="NUMA nodes to spread the CPUs over; default: all of the node's.",
    )
    reserved_cpus_per_numa_node: int = Field(
        default=0,
        ge=0,
        le=256,
        description="CPUs left free at the end of each NUMA node for the "
        "accelerator engine and router (Kunpeng BoostKit reserves 4 with sameNode).",
    )
    quantization: Quantization = Field(
        default="q8_0", description="Weight quantization on the CPU (`SYSHAX_QUANTIZE`)."
    )
    gemv_tiling: Literal[2, 4] | None = Field(
        default=None,
        description="GEMV row tiling (`NRC`); Kunpeng guidance: 4 with q4_0, "
        "2 with q8_0. Default: that guidance, except for the builtin engine, which "
        "then chooses per matrix by row width.",
    )
    memory: bounded_quantity("decode.memory", "64Mi", "16Ti") = Field(
        default="64Gi", description="Memory request and limit per pod."
    )
    engine: DecodeEngineSpec = Field(
        default_factory=DecodeEngineSpec,
        json_schema_extra=OBJECT_DEFAULT,
        description="The CPU engine.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Extra node selector.")


class OffloadSpec(ApiModel):
    """When the router moves decode to the CPUs (sysHAX's decider)."""

    kv_cache_usage_threshold: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Offload when the accelerator's KV-cache usage "
        "fraction exceeds this (older sysHAX: 90 %).",
    )
    min_cpu_tokens_per_second: float = Field(
        default=10,
        ge=0,
        le=100000,
        description="Offload only while the CPU tier decodes at least this fast per request.",
    )
    cpu_max_batch_size: int = Field(
        default=16,
        ge=1,
        le=MAX_SEQS,
        description="Send no more concurrent sequences to one CPU engine.",
    )


class RouterSpec(ApiModel):
    """The router sidecar in every serving pod."""

    policy: Literal["auto", "accelerator", "cpu", "split"] = Field(
        default="auto",
        description="auto: offload decode when the accelerator is under "
        "pressure; accelerator/cpu: one tier does everything; split: always prefill on the "
        "accelerator and decode on the CPU.",
    )
    port: int = Field(
        default=8010, ge=1024, le=65535, description="Router port (the sysHAX conductor's 8010)."
    )
    image: str | None = Field(default=None, description="Router image; default: heteroserve's.")
    offload: OffloadSpec = Field(
        default_factory=OffloadSpec,
        json_schema_extra=OBJECT_DEFAULT,
        description="Offload thresholds.",
    )
    request_timeout_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description="Per-request timeout.",
    )


class ServiceSpec(ApiModel):
    """The Service in front of the routers."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Service type."
    )
    port: int = Field(default=8010, ge=1, le=65535, description="Service port.")


class IngressSpec(ApiModel):
    """An optional Ingress to the Service."""

    enabled: bool = Field(default=False, description="Create an Ingress.")
    host: str | None = Field(default=None, description="Host name.")
    class_name: str | None = Field(default=None, description="IngressClass.")
    tls_secret_name: str | None = Field(default=None, description="TLS Secret for the host.")


class InferenceDeploymentSpec(ApiModel):
    """A model served by accelerator prefill pods and NUMA-pinned CPU decode pods behind one
    OpenAI-compatible endpoint."""

    model_config = rules(
        cel(
            "has(self.prefill) || has(self.decode)",
            "at least one of prefill and decode must be set",
        ),
        cel(
            "!has(self.decode) || self.decode.placement != 'sameNode' || has(self.prefill)",
            "decode.placement sameNode uses the host cores of the prefill nodes, so it needs "
            "a prefill section",
        ),
        cel(
            "!(self.router.policy in ['cpu', 'split']) || has(self.decode)",
            "router.policy cpu and split need a decode section",
        ),
        cel(
            "!(self.router.policy in ['accelerator', 'split']) || has(self.prefill)",
            "router.policy accelerator and split need a prefill section",
        ),
        cel(
            "!has(self.prefill) || !has(self.prefill.engine.script) || "
            "self.prefill.engine.script != 'start_vllm' || "
            f"self.model.maxModelLen <= {START_VLLM_MAX_MODEL_LEN}",
            f"engine.script start_vllm allows model.maxModelLen up to {START_VLLM_MAX_MODEL_LEN} "
            "on a single node",
        ),
    )

    model: ModelSpec = Field(description="The served model.")
    prefill: PrefillSpec | None = Field(
        default=None, description="Accelerator prefill; absent: a CPU-only deployment."
    )
    decode: DecodeSpec | None = Field(
        default=None, description="CPU decode; absent: an accelerator-only deployment."
    )
    router: RouterSpec = Field(
        default_factory=RouterSpec,
        json_schema_extra=OBJECT_DEFAULT,
        description="Routing and offload.",
    )
    service: ServiceSpec = Field(
        default_factory=ServiceSpec, json_schema_extra=OBJECT_DEFAULT, description="Service."
    )
    ingress: IngressSpec = Field(
        default_factory=IngressSpec, json_schema_extra=OBJECT_DEFAULT, description="Ingress."
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> InferenceDeploymentSpec:
        """The CEL rules again, for local mode (no apiserver)."""
        errors = [rule["message"] for rule in python_rule_failures(self)]
        if errors:
            raise ValueError("; ".join(errors))
        return self


# On the whole object (the CRD's root): the name every child is derived from.
NAME_RULES = [
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: the operator names the "
        f"children <name>{', <name>'.join(CHILD_NAME_SUFFIXES)}; each must stay a DNS label "
        f"of at most {DNS_LABEL_MAX} characters",
    ),
    cel(
        f"self.metadata.name.matches('{DNS_1035_PATTERN}')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
        "with a letter and ending with a letter or digit; no dots): it names the Services",
    ),
]


def name_rule_failures(name: str) -> list[dict[str, str]]:
    """The NAME_RULES in Python, for local mode."""
    results = [len(name) <= MAX_NAME_LENGTH, re.fullmatch(DNS_1035_PATTERN, name) is not None]
    return [rule for rule, ok in zip(NAME_RULES, results, strict=True) if not ok]


def python_rule_failures(spec: InferenceDeploymentSpec) -> list[dict[str, str]]:
    """Evaluates the spec's CEL rules with their Python equivalents."""
    failures = []
    checks: list[tuple[type[ApiModel], object, list[bool]]] = [
        (
            InferenceDeploymentSpec,
            spec,
            [
                spec.prefill is not None or spec.decode is not None,
                spec.decode is None
                or spec.decode.placement != "sameNode"
                or spec.prefill is not None,
                spec.router.policy not in ("cpu", "split") or spec.decode is not None,
                spec.router.policy not in ("accelerator", "split") or spec.prefill is not None,
                spec.prefill is None or spec.prefill.engine.script != "start_vllm"
                or spec.model.max_model_len <= START_VLLM_MAX_MODEL_LEN,
            ],
        ),
    ]
    if spec.model.volume:
        v = spec.model.volume
        checks.append((ModelVolume, v, [(v.claim_name is None) != (v.host_path is None)]))
    if spec.prefill:
        p = spec.prefill
        for token_range in (p.engine.input_range, p.engine.output_range):
            if token_range:
                checks.append((TokenRange, token_range, [token_range.min <= token_range.max]))
        checks.append(
            (
                PrefillSpec,
                p,
                [
                    p.engine.kind != "vllm-gaudi" or p.accelerator.type == "gaudi",
                    p.engine.kind != "vllm-ascend" or p.accelerator.type == "ascend",
                    p.engine.kind != "vllm" or p.accelerator.type == "nvidia",
                    p.engine.kind != "ksana" or p.accelerator.type != "gaudi",
                    p.engine.warmup is None or p.accelerator.type == "gaudi",
                    p.engine.script is None or p.engine.kind == "vllm-gaudi",
                    p.engine.quantization is None or p.engine.script == "start_vllm",
                    p.engine.script != "start_vllm" or p.accelerator.count == 8,
                    p.engine.script != "start_vllm" or p.engine.image is not None,
                    p.engine.script != "start_vllm" or not (
                        p.accelerator.module_ids is not None or p.engine.input_range is not None
                        or p.engine.output_range is not None
                        or p.engine.max_num_batched_tokens is not None
                        or (p.engine.warmup is not None and (
                            p.engine.warmup.reduced_max_batch_size is not None
                            or p.engine.warmup.reduced_max_seq_len is not None))),
                ],
            )
        )
        a = p.accelerator
        checks.append(
            (
                AcceleratorSpec,
                a,
                [
                    a.module_ids is None or a.type == "gaudi",
                    a.module_ids is None or len(a.module_ids) == a.count,
                ],
            )
        )
    if spec.decode:
        d = spec.decode
        checks.append((DecodeEngineSpec, d.engine, [
            not any(e.name in OPERATOR_DECODE_ENV for e in d.engine.env)]))
        checks.append(
            (
                DecodeSpec,
                d,
                [
                    d.numa_nodes is None or d.cpus % d.numa_nodes == 0,
                    d.gemv_tiling is None or d.engine.kind != "sysinfer",
                ],
            )
        )
    for model, _obj, results in checks:
        for rule, ok in zip(model.cel_rules(), results, strict=True):
            if not ok:
                failures.append(rule)
    return failures


# -- status ---------------------------------------------------------------------------------------
class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(description="Ready, PrefillReady, DecodeReady, RouterReady or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="Condition status.")
    reason: str = Field(default="", description="CamelCase reason.")
    message: str = Field(default="", description="Human-readable detail.")
    observed_generation: int | None = Field(
        default=None, description="Spec generation this was computed for."
    )
    last_transition_time: str | None = Field(
        default=None, description="When the status last changed."
    )


class TierStatus(ApiModel):
    """Replica counts of one tier."""

    replicas: int = Field(default=0, description="Desired pods.")
    ready_replicas: int = Field(default=0, description="Ready pods.")


class DecodePodPlan(ApiModel):
    """The NUMA plan of one decode pod."""

    pod: str = Field(description="Pod name ('template' for the plan rendered into the spec).")
    node: str = Field(default="", description="Node the pod runs on.")
    cpus: str = Field(description="Bound CPUs (CUSTOM_CPU_AFFINITY).")
    threads: int = Field(description="OMP_NUM_THREADS.")
    numa_nodes: list[int] = Field(default_factory=list, description="NUMA nodes used.")


class DecodeBinding(ApiModel):
    """The CPUs one decode engine actually bound, as the engine itself reports them on its
    /metrics (heteroserve:cpu_binding_info, measured from its compute threads' affinity). The
    operator reads it over the pod's IP once per engine start; engine pods have no API token."""

    pod: str = Field(description="Pod name.")
    node: str = Field(description="Node the pod runs on.")
    state: Literal["Reported", "NotReported", "Unknown"] = Field(
        description="Reported: the engine reported its binding (cpus, threads, numaNodes). "
        "NotReported: the engine's /metrics has no binding (engines other than heteroserve's "
        "CPU engine: vllm-cpu, sysInfer). Unknown: not learned yet (the engine is not ready, "
        "or its /metrics could not be read; the operator retries and logs why)."
    )
    cpus: str | None = Field(
        default=None, description="CPUs the compute threads are pinned to (Linux list, 0-3,8)."
    )
    threads: int | None = Field(default=None, description="Compute threads.")
    numa_nodes: list[int] = Field(
        default_factory=list, description="NUMA nodes of the bound CPUs."
    )
    engine_started_at: str | None = Field(
        default=None,
        description="Start of the engine container this was learned from; a restarted "
        "container is read again.",
    )


class InferenceDeploymentStatus(ApiModel):
    """Observed state."""

    observed_generation: int | None = Field(default=None, description="Last reconciled spec.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    endpoint: str | None = Field(default=None, description="OpenAI base URL inside the cluster.")
    prefill: TierStatus | None = Field(default=None, description="Prefill replicas.")
    decode: TierStatus | None = Field(default=None, description="Decode replicas.")
    numa_plans: list[DecodePodPlan] = Field(
        default_factory=list, description="NUMA plan per decode pod."
    )
    decode_bindings: list[DecodeBinding] = Field(
        default_factory=list,
        description="CPUs each decode engine actually bound, as it reports them (numaPlans is "
        "the operator's plan; this is what the engine measured).",
    )
