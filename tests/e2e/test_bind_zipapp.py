"""The binding for engine images that do not carry heteroserve-bind (sysHAX's CPU vLLM,
sysInfer), run as the rendered pod says, on this machine under `taskset`.

The rendered init container's command writes the zipapp; the rendered engine command (`python3
<zipapp> --numa-nodes N --threads-per-node K -- <the seed's command>`) starts, from the rendered
working directory and environment, a stand-in for the seed's engine that serves on loopback what
it got: its pid, argv, CPU affinity and variables. `python3` is the system interpreter, which has
none of heteroserve installed (the engine images' Python has not either), so the zipapp proves to
be self-contained.

Two things differ from a kubelet: paths under /var/run/heteroserve/bind and the working directory
are temporary directories, and `taskset` stands in for the cgroup cpuset the kubelet grants.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.render.children import render
from heteroserve_operator.render.engines import bind_wrapper
from heteroserve_operator.render.facts import ClusterFacts
from heteroserve_operator.render.meta import Owner
from tests.processes import free_port, stop_process

SYSTEM_PYTHON = "/usr/bin/python3"
CPUS = sorted(os.sched_getaffinity(0))
# Serves GET / with what the process got; the port comes from FAKE_ENGINE_PORT.
FAKE_ENGINE = """\
#!/usr/bin/env python3
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

SHOWN = ("OMP_NUM_THREADS", "CUSTOM_CPU_AFFINITY", "GOMP_CPU_AFFINITY", "INFERENCE_OP_MODE",
         "SYSHAX_QUANTIZE", "NRC", "HOME")


class Show(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(),
                           "affinity": sorted(os.sched_getaffinity(0)),
                           "env": {k: os.environ.get(k) for k in SHOWN}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


HTTPServer(("127.0.0.1", int(os.environ["FAKE_ENGINE_PORT"])), Show).serve_forever()
"""


@pytest.fixture(scope="module", autouse=True)
def tools_present():
    assert shutil.which("taskset"), "the binding tests need taskset (util-linux)"
    assert Path(SYSTEM_PYTHON).exists()
    done = subprocess.run([SYSTEM_PYTHON, "-c", "import heteroserve_engines"],
                          check=False, capture_output=True)
    assert done.returncode != 0, ("the system python3 has heteroserve_engines installed: it "
                                  "cannot show that the zipapp is self-contained")


def rendered_decode(kind: str, cpus: int) -> tuple[dict, dict]:
    """(pod spec, engine container) of a CPU-only deployment of `kind` on one NUMA node; no
    topology published, so the plan is the count alone (the node's grant decides the CPUs)."""
    spec = InferenceDeploymentSpec.model_validate({
        "model": {"name": "m", "path": "/models/m.gguf"}, "router": {"policy": "cpu"},
        "decode": {"cpus": cpus, "numaNodes": 1, "quantization": "q4_0",
                   "engine": {"kind": kind}}})
    (deployment,) = [c for c in render(spec, Owner("m", "ns", "u"), ClusterFacts()).children
                     if c["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "engine")


def local(argv: list[str], root: Path) -> list[str]:
    return [a.replace(bind_wrapper.DIRECTORY, str(root / "bind")) for a in argv]


def prepare(tmp: Path, pod: dict, engine: dict) -> tuple[list[str], dict[str, str], Path]:
    """Runs the rendered init container's command (with this venv's heteroserve, as the CPU
    engine image has it installed), lays out the seed's executables, and returns the engine's
    argv, environment and working directory."""
    (init,) = pod["initContainers"]
    init_argv = local(init["command"], tmp)
    assert init_argv[0] == "python"
    subprocess.run([sys.executable, *init_argv[1:]], check=True, timeout=60)
    workdir = tmp / "app"
    bin_dir = tmp / "bin"
    for directory in (workdir, bin_dir):
        directory.mkdir()
    # sysInfer's ./server in its working directory; sysHAX's `vllm` on the PATH.
    for path in (workdir / "server", bin_dir / "vllm"):
        path.write_text(FAKE_ENGINE)
        path.chmod(0o755)
    env = {e["name"]: e["value"] for e in engine["env"]}
    env["PATH"] = f"{bin_dir}:{Path(SYSTEM_PYTHON).parent}:/bin"
    argv = local([*engine["command"], *engine["args"]], tmp)
    return argv, env, workdir if engine.get("workingDir") else tmp


def serve(argv: list[str], env: dict[str, str], cwd: Path, cpu: int, log: Path):
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(["taskset", "-c", str(cpu), *argv],
                                env={**env, "FAKE_ENGINE_PORT": str(port)}, cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"exited {proc.returncode}: {log.read_text()}"
        assert time.monotonic() < deadline, f"never served: {log.read_text()}"
        try:
            return proc, httpx.get(f"http://127.0.0.1:{port}/", timeout=1).json()
        except httpx.HTTPError:
            time.sleep(0.1)


@pytest.mark.parametrize(("kind", "seed_argv"), [
    ("sysinfer", ["./server", "/models/m.gguf", "-t", "0.0", "-n"]),
    ("vllm-cpu", ["vllm", "serve", "/models/m.gguf", "--served-model-name=m"])])
def test_the_seeds_engine_runs_bound_to_the_granted_cpu(tmp_path, kind, seed_argv):
    pod, engine = rendered_decode(kind, cpus=1)
    argv, env, cwd = prepare(tmp_path, pod, engine)
    assert argv[0] == "python3"
    # The operator's plan (no topology known: CPU 0) stays in the env as the stale fallback.
    assert env["CUSTOM_CPU_AFFINITY"] == "0"
    cpu = CPUS[-1]
    proc, shown = serve(argv, env, cwd, cpu, tmp_path / "engine.log")
    try:
        assert shown["pid"] == proc.pid  # taskset, python3 and the engine: one process (exec)
        # The seed's own command line (the kernel hands the interpreter the script's path).
        assert Path(shown["argv"][0]).name == Path(seed_argv[0]).name
        assert shown["argv"][1:len(seed_argv)] == seed_argv[1:]
        assert shown["cwd"] == str(cwd)
        assert shown["affinity"] == [cpu]
        expected = {"OMP_NUM_THREADS": "1", "CUSTOM_CPU_AFFINITY": str(cpu),
                    "GOMP_CPU_AFFINITY": str(cpu), "HOME": "/tmp"}
        if kind == "vllm-cpu":  # sysHAX's knobs pass through untouched
            expected |= {"INFERENCE_OP_MODE": "fused", "SYSHAX_QUANTIZE": "q4_0", "NRC": "4"}
        assert {k: v for k, v in shown["env"].items() if v is not None} == expected
        log = (tmp_path / "engine.log").read_text()
        assert f"heteroserve-bind: granted CPUs {cpu} (sched_getaffinity {cpu}" in log
        if cpu != 0:
            assert "replaced the pod's CUSTOM_CPU_AFFINITY, GOMP_CPU_AFFINITY" in log
    finally:
        stop_process(proc)


def test_a_grant_smaller_than_the_plan_never_starts_the_seeds_engine(tmp_path):
    pod, engine = rendered_decode("sysinfer", cpus=2)
    argv, env, cwd = prepare(tmp_path, pod, engine)
    done = subprocess.run(["taskset", "-c", str(CPUS[0]), *argv], check=False, env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "is smaller than the plan: 2 CPUs on each of 1 NUMA node(s)" in done.stderr
    assert done.stdout == ""  # the stand-in engine never ran (it would serve forever)


def test_the_zipapp_refuses_an_interpreter_too_old_to_run_it(tmp_path):
    """The version guard runs before any of the package's code (no syntax of a newer Python
    is reached)."""
    from heteroserve_engines.bind import zipapp

    target = zipapp.build(tmp_path / "hb.pyz")
    fake_old = ("import runpy, sys; sys.version_info = (3, 7, 9, 'final', 0); "
                f"sys.argv = [{str(target)!r}, '--', 'true']; "
                f"runpy.run_path({str(target)!r}, run_name='__main__')")
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", fake_old], check=False,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "heteroserve-bind: needs Python 3.8 or later, this is 3.7" in done.stderr
    assert done.stdout == ""
