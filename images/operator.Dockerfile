# The operator image: the heteroserve wheel (operator + data-plane Python packages) on a slim
# Python, run as a non-root user with a read-only root filesystem (see charts/heteroserve).
# Build from the repository root:  docker build -f images/operator.Dockerfile -t ghcr.io/heteroserve/operator:0.1.0 .
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
EXPOSE 8080 8081
ENTRYPOINT ["heteroserve-operator"]
