"""Default container images per engine kind (overridable per InferenceDeployment)."""

HETEROSERVE_VERSION = "0.1.0"
REGISTRY = "ghcr.io/heteroserve"

ROUTER = f"{REGISTRY}/router:{HETEROSERVE_VERSION}"
CPU_ENGINE = f"{REGISTRY}/cpu-engine:{HETEROSERVE_VERSION}"
PREFILL_ENGINE = f"{REGISTRY}/prefill-engine:{HETEROSERVE_VERSION}"
VLLM = "vllm/vllm-openai:v0.11.0"
VLLM_ASCEND = "quay.io/ascend/vllm-ascend:v0.11.0"
# Built by images/vllm-gaudi.Dockerfile: the seed's Gaudi 1.21.3 PyTorch image + vllm-fork
# aice/v1.21.0 (seed 003, section 1.4).
VLLM_GAUDI = f"{REGISTRY}/vllm-gaudi:1.21.3"
KSANA_GPU = f"{REGISTRY}/ksana-llm:gpu"
KSANA_NPU = f"{REGISTRY}/ksana-llm:npu"
# The sysHAX CPU vLLM (seed 001) and the sysInfer server (seed 002), as published.
SYSHAX_VLLM_CPU = "hub.oepkgs.net/neocopilot/syshax/syshax-vllm-cpu:0.2.1"
SYSINFER = "hub.oepkgs.net/neocopilot/oe_openai_server:0.0.1"
