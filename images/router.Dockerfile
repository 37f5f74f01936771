# The router sidecar image: the heteroserve wheel (pure Python; the router needs no compiled
# kernels) on a slim Python, run as non-root with a read-only root filesystem (the operator
# renders it so: render/containers.py `router_container`, config mounted from a ConfigMap).
# Build from the repository root:  docker build -f images/router.Dockerfile -t ghcr.io/heteroserve/router:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator operator
COPY engines engines
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 1000 --user-group --no-create-home heteroserve
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 1000:1000
# The root filesystem is read-only in the pod: no bytecode cache written at run time.
ENV PYTHONDONTWRITEBYTECODE=1
EXPOSE 8010
ENTRYPOINT ["heteroserve-router"]
CMD ["--config", "/etc/heteroserve/router/router.yaml"]
