"""`heteroserve-bind` as the engine images run it, on this machine under `taskset`: the binding
comes from the affinity and cgroup cpuset the process was granted, the variables reach the
engine, the entrypoint execs (the engine keeps its pid, so the kubelet's signals reach it), and a
real `heteroserve-cpu-engine` started through it serves on the CPUs it computed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port, stop_process

BIN = Path(sys.executable).parent
BIND = str(BIN / "heteroserve-bind")
SHOW_ENV = ("import json, os; print(json.dumps({'pid': os.getpid(), 'env': {k: os.environ.get(k)"
            " for k in ('OMP_NUM_THREADS', 'CUSTOM_CPU_AFFINITY', 'GOMP_CPU_AFFINITY')}}))")
# What today's operator renders into every replica's env: the entrypoint must replace it.
STALE = {"OMP_NUM_THREADS": "2", "CUSTOM_CPU_AFFINITY": "0-1", "GOMP_CPU_AFFINITY": "0-1"}
CPUS = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module", autouse=True)
def taskset_present():
    assert shutil.which("taskset"), "the e2e binding tests need taskset (util-linux)"
    assert Path(BIND).exists(), "heteroserve-bind is not installed: pip install -e . --no-deps"


def bind(*args: str, cpus: str) -> subprocess.CompletedProcess:
    return subprocess.run(["taskset", "-c", cpus, BIND, *args], check=False,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("cpu", CPUS[:2])
def test_the_engine_gets_the_cpu_taskset_granted_and_runs_in_the_same_process(cpu):
    proc = subprocess.Popen(["taskset", "-c", str(cpu), BIND, "--", sys.executable, "-c",
                             SHOW_ENV], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **STALE})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    shown = json.loads(out)
    assert shown["env"] == {"OMP_NUM_THREADS": "1", "CUSTOM_CPU_AFFINITY": str(cpu),
                            "GOMP_CPU_AFFINITY": str(cpu)}
    assert shown["pid"] == proc.pid  # exec'd, not a child
    assert f"binding 1 threads on CPUs {cpu} (NUMA node 0: 1)" in err


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs")
def test_two_cpus_of_one_numa_node_bind_two_threads():
    done = bind("--numa-nodes", "1", "--", sys.executable, "-c", SHOW_ENV,
                cpus=f"{CPUS[0]},{CPUS[1]}")
    assert done.returncode == 0, done.stderr
    listed = f"{CPUS[0]}-{CPUS[1]}" if CPUS[1] == CPUS[0] + 1 else f"{CPUS[0]},{CPUS[1]}"
    assert json.loads(done.stdout)["env"] == {"OMP_NUM_THREADS": "2",
                                              "CUSTOM_CPU_AFFINITY": listed,
                                              "GOMP_CPU_AFFINITY": listed}


def test_a_grant_smaller_than_the_plan_never_starts_the_engine(tmp_path):
    marker, log = tmp_path / "engine-ran", tmp_path / "termination-log"
    log.write_text("")
    done = bind("--threads-per-node", "2", "--termination-log", str(log), "--",
                sys.executable, "-c", f"open({str(marker)!r}, 'w')", cpus=str(CPUS[0]))
    assert done.returncode == 2
    assert not marker.exists()
    reason = (f"heteroserve-bind: the grant {CPUS[0]} (node 0: 1) is smaller than the plan: 2 "
              "CPUs on each of 1 NUMA node(s) (2 threads), but node 0 has 1")
    assert done.stderr.startswith(reason)
    assert log.read_text().startswith(reason)


def test_more_numa_nodes_than_the_machine_has_are_refused():
    done = bind("--numa-nodes", "2", "--", "true", cpus=str(CPUS[0]))
    assert done.returncode == 2
    assert "spans 1 NUMA node(s) but the plan binds 2" in done.stderr


def test_the_cpu_engine_started_through_it_serves_on_the_bound_cpu(tmp_path):
    cpu = CPUS[-1]
    port = free_port()
    log = tmp_path / "engine.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["taskset", "-c", str(cpu), BIND, "--numa-nodes", "1", "--threads-per-node", "1",
             "--", str(BIN / "heteroserve-cpu-engine"), "--port", str(port),
             "--kv-cache-gib", "0.25", "--max-model-len", "256"],
            env={**os.environ, **STALE}, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"engine exited {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"engine never healthy: {log.read_text()}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        text = log.read_text()
        assert f"heteroserve-bind: granted CPUs {cpu} (sched_getaffinity {cpu}" in text
        # The engine's startup line: the CPUs it bound, from the exported list, not the stale
        # one.
        assert re.search(rf"on 1 threads bound to \[{cpu}\] \(CUSTOM_CPU_AFFINITY\)", text), text
        assert os.sched_getaffinity(proc.pid) == {cpu}
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert any(part.endswith(b"heteroserve-cpu-engine") for part in cmdline), cmdline
        base = f"http://127.0.0.1:{port}/v1"
        model = httpx.get(f"{base}/models", timeout=5).json()["data"][0]["id"]
        answer = httpx.post(f"{base}/completions", timeout=60,
                            json={"model": model, "prompt": "The capital of France is",
                                  "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
    finally:
        stop_process(proc)
