"""The CPU engine as users run it: a `heteroserve-cpu-engine` process on loopback serving the
embedded SmolLM2 model, talked to with the official `openai` client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cluster.harness import free_port
from tests.processes import metric_value, stop_process
from tests.variants import BATCH_INVARIANT


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def metrics(self) -> str:
        """One scrape of /metrics: values read from one text are from the same moment."""
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def metric(self, name: str) -> float:
        return metric_value(self.metrics(), name)


def start_engine(tmp: Path, *args: str, env: dict[str, str] | None = None,
                 wait: bool = True) -> EngineProcess:
    port = free_port()
    log = tmp / f"engine-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "heteroserve_engines.cpu_engine", "--port", str(port),
             "--kv-cache-gib", "0.25", *args],
            env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
    engine = EngineProcess(proc, port, log)
    if wait:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"engine exited {proc.returncode}: {log.read_text()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return engine
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"engine did not become healthy: {log.read_text()}")
    return engine


def stop_engine(engine: EngineProcess) -> None:
    stop_process(engine.proc)


@pytest.fixture(scope="session")
def engine(tmp_path_factory) -> Iterator[EngineProcess]:
    # On the batch-invariant vector variant (tests/variants.py): the API tests compare a
    # request's greedy text alone and inside a batch, whose prefill steps of 16 or more tokens
    # would otherwise run on the matrix unit and may take another path at a near-tie.
    process = start_engine(tmp_path_factory.mktemp("engine"), "--max-model-len", "512",
                           "--kernels", BATCH_INVARIANT)
    try:
        yield process
    finally:
        stop_engine(process)


@pytest.fixture(scope="session")
def client(engine):
    from openai import OpenAI

    return OpenAI(base_url=engine.base_url, api_key="unused", max_retries=0, timeout=120)
