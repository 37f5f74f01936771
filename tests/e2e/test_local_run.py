"""`heteroserve run` as users run it: a real supervisor process starting the router and the CPU
engine on the embedded SmolLM2 model, talked to with the official `openai` client; an engine
killed with SIGKILL comes back; SIGTERM ends an in-flight stream with a final chunk and leaves no
process behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from heteroserve_engines.cpu_engine.__main__ import default_model
from heteroserve_local.default_spec import MODEL, default_spec
from heteroserve_local.topology import machine_topology
from tests.cluster.harness import free_port
from tests.processes import stop_process

DRAIN_SECONDS = 2


def write_spec(path: Path, engine_port: int) -> None:
    """The default spec (`heteroserve run` without -f), on a free engine port."""
    spec = default_spec(machine_topology("test"), default_model()).model_dump(
        mode="json", by_alias=True, exclude_none=True)
    spec["decode"]["engine"]["port"] = engine_port
    spec["decode"]["engine"]["args"] += ["--kv-cache-gib", "0.25"]
    path.write_text(yaml.safe_dump({"apiVersion": "heteroserve.io/v1alpha1",
                                    "kind": "InferenceDeployment",
                                    "metadata": {"name": "smollm2"}, "spec": spec}))


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"heteroserve run exited {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 within {timeout} s:\n{log.read_text()}")


def wait_for_line(text: str, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def read_pid(run_dir: Path, name: str) -> int:
    return int((run_dir / f"{name}.pid").read_text())


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def chat(base_url: str) -> str:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name three colors."}],
        max_tokens=8, temperature=0)
    return reply.choices[0].message.content


@pytest.mark.timeout(180)
def test_run_serves_restarts_a_killed_engine_and_drains_on_sigterm(tmp_path):
    engine_port, router_port = free_port(), free_port()
    while router_port == engine_port:
        router_port = free_port()
    spec, run_dir, log = tmp_path / "smollm2.yaml", tmp_path / "run", tmp_path / "run.log"
    write_spec(spec, engine_port)
    router, base_url = f"http://127.0.0.1:{router_port}", f"http://127.0.0.1:{router_port}/v1"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "heteroserve_local", "run", "-f", str(spec),
             "--port", str(router_port), "--run-dir", str(run_dir),
             "--drain-seconds", str(DRAIN_SECONDS)], stdout=out, stderr=subprocess.STDOUT)
    pids: set[int] = set()
    try:
        wait_for(f"{router}/ready", proc, log)
        wait_for_line(f"OpenAI API on {base_url}", proc, log)
        assert chat(base_url)
        pids |= {read_pid(run_dir, "router"), read_pid(run_dir, "decode")}

        # A crashed engine is restarted; the router takes it back once its checks pass.
        killed = read_pid(run_dir, "decode")
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while read_pid(run_dir, "decode") == killed:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        pids.add(read_pid(run_dir, "decode"))
        wait_for_line(f"decode (pid {killed}) exited (killed by SIGKILL); restarting", proc, log)
        wait_for(f"http://127.0.0.1:{engine_port}/health", proc, log)
        wait_for(f"{router}/ready", proc, log)
        assert chat(base_url)

        # SIGTERM while a long stream runs: the stream gets a final chunk and [DONE].
        events: list[str] = []
        request = {"model": MODEL, "prompt": "Count to one thousand:", "stream": True,
                   "max_tokens": 1500, "ignore_eos": True}
        with httpx.stream("POST", f"{base_url}/completions", json=request, timeout=60) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[len("data: "):])
                if len(events) == 1:
                    proc.send_signal(signal.SIGTERM)
        assert events[-1] == "[DONE]"
        final = json.loads(events[-2])
        assert ("error" in final and final["error"]["code"] == "shutting_down") or \
            final["choices"][0]["finish_reason"], final
        assert len(events) > 2  # tokens kept coming while the router drained
        assert proc.wait(timeout=DRAIN_SECONDS + 30) == 0, log.read_text()
        assert not [pid for pid in pids if alive(pid)], log.read_text()
    finally:
        stop_process(proc)
        for pid in pids:  # only if the test failed half-way: the run's own children
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
