"""Router processes for the end-to-end tests: `heteroserve-router --config` on loopback, with a
configuration written from a dict (camelCase, as the operator renders it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.cluster.harness import free_port
from tests.processes import metric_value, stop_process

# Fast checks so that tests wait on state changes, not on sysHAX's 10 s interval.
FAST_CHECKS = {"health": {"intervalSeconds": 0.2, "timeoutSeconds": 1, "failureThreshold": 2},
               "scrapeIntervalSeconds": 0.1}


@dataclass
class RouterProcess:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        return metric_value(self.metrics(), name, **labels)

    def ready(self) -> bool:
        return httpx.get(self.url + "/ready", timeout=5).status_code == 200


def start_router(tmp: Path, config: dict, *, wait_ready: bool = True,
                 fast: bool = True) -> RouterProcess:
    port = free_port()
    document = {**(FAST_CHECKS if fast else {}), **config,
                "listen": {"host": "127.0.0.1", "port": port}}
    path = tmp / f"router-{port}.yaml"
    path.write_text(yaml.safe_dump(document))
    log = tmp / f"router-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "heteroserve_engines.router",
                                 "--config", str(path)],
                                env=os.environ.copy(), stdout=out, stderr=subprocess.STDOUT)
    router = RouterProcess(proc, port, log)
    wait_until(lambda: _answers(router, "/ready" if wait_ready else "/health"), 30,
               lambda: f"router not {'ready' if wait_ready else 'up'}: {log.read_text()}",
               proc=proc)
    return router


def _answers(router: RouterProcess, path: str) -> bool:
    try:
        return httpx.get(router.url + path, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(condition, timeout: float, message, proc: subprocess.Popen | None = None,
               interval: float = 0.05) -> float:
    """Polls `condition` until true; returns the seconds it took. Fails with `message()`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited {proc.returncode}: {message()}")
        if condition():
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError(message())


def stop_router(router: RouterProcess) -> None:
    stop_process(router.proc, grace=10)


@dataclass
class CannedUpstream:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_canned(*args: str, port: int | None = None) -> CannedUpstream:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.canned_upstream", "--port",
                             str(port), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    upstream = CannedUpstream(proc, port)
    wait_until(lambda: _answers_url(upstream.url + "/v1/models"), 20,
               lambda: "canned upstream did not start", proc=proc)
    return upstream


def _answers_url(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
