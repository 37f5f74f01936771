"""Every seed sample becomes Ready on the fake seed machines, and its pods carry exactly what the
seeds specify (asserted field by field on the live objects)."""

from __future__ import annotations

import pytest
import yaml

from tests.integration.conftest import SAMPLES, get_json, wait_ready

pytestmark = pytest.mark.integration


def pods(cluster, namespace: str, name: str, component: str) -> list[dict]:
    return get_json(cluster, "pods", "-n", namespace, "-l",
                    f"app.kubernetes.io/instance={name},app.kubernetes.io/component={component}"
                    )["items"]


def container(pod: dict, name: str) -> dict:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def env(c: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


def mounts(c: dict) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


BIND_ZIPAPP = "/var/run/heteroserve/bind/heteroserve-bind.pyz"


def check_bound_from_the_grant(pod: dict, engine: dict, *, numa_nodes: int, per_node: int,
                               seed_command: list[str]) -> None:
    """An image without heteroserve-bind (sysHAX's CPU vLLM, sysInfer) runs the zipapp an init
    container from heteroserve's CPU engine image wrote, in front of the seed's own command."""
    assert engine["command"] == ["python3", BIND_ZIPAPP, "--numa-nodes", str(numa_nodes),
                                 "--threads-per-node", str(per_node), "--", *seed_command]
    (init,) = pod["spec"]["initContainers"]
    assert init["image"] == "ghcr.io/heteroserve/cpu-engine:0.1.0"
    assert init["command"] == ["python", "-m", "heteroserve_engines.bind.zipapp", BIND_ZIPAPP]
    assert init["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert mounts(init)["/var/run/heteroserve/bind"] == mounts(engine)[
        "/var/run/heteroserve/bind"] == "heteroserve-bind"
    assert "emptyDir" in volumes(pod)["heteroserve-bind"]
    # The init container keeps the pod Guaranteed (exclusive cores for the engine).
    assert init["resources"]["requests"] == init["resources"]["limits"]
    assert pod["status"]["qosClass"] == "Guaranteed"


SYSHAX_GPU_ARGS = [
    "--served-model-name=ds-32b", "--host", "0.0.0.0", "--port", "8001", "--dtype=half",
    "--swap_space=16", "--block_size=16", "--preemption_mode=swap", "--max_model_len=8192",
    "--tensor-parallel-size", "2", "--gpu_memory_utilization=0.8", "--enable-auto-pd-offload"]
SYSHAX_CPU_ARGS = [
    "--served-model-name=ds-32b", "--host", "0.0.0.0", "--port", "8002", "--dtype=half",
    "--block_size=16", "--preemption_mode=swap", "--max_model_len=8192",
    "--enable-auto-pd-offload"]


def check_syshax(cluster, ns, name, *, cpus, affinity, quant, nrc, memory):
    (prefill,) = pods(cluster, ns, name, "prefill")
    (decode,) = pods(cluster, ns, name, "decode")
    gpu = container(prefill, "engine")
    assert gpu["image"] == "hub.oepkgs.net/neocopilot/syshax/syshax-vllm-gpu:0.2.1"
    assert gpu["command"] == ["vllm", "serve", "/home/models/DeepSeek-R1-Distill-Qwen-32B"]
    assert gpu["args"] == SYSHAX_GPU_ARGS
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert mounts(gpu)["/dev/shm"] == "dshm"
    assert volumes(prefill)["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert volumes(prefill)["models"]["hostPath"]["path"] == "/home/models"
    assert container(prefill, "router")["ports"][0]["containerPort"] == 8010
    cpu = container(decode, "engine")
    check_bound_from_the_grant(decode, cpu, numa_nodes=4, per_node=cpus // 4, seed_command=[
        "vllm", "serve", "/home/models/DeepSeek-R1-Distill-Qwen-32B"])
    assert cpu["args"] == SYSHAX_CPU_ARGS
    # The seed's --privileged, reduced to the NUMA syscalls the default seccomp profile refuses:
    # UID 1000, no capabilities, seccomp Unconfined (docs/security.md).
    assert decode["spec"]["securityContext"]["runAsUser"] == 1000
    assert cpu["securityContext"]["seccompProfile"] == {"type": "Unconfined"}
    assert cpu["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert cpu["securityContext"]["allowPrivilegeEscalation"] is False
    assert env(cpu) | {"HOME": "/tmp"} == {
        "INFERENCE_OP_MODE": "fused", "OMP_NUM_THREADS": str(cpus),
        "CUSTOM_CPU_AFFINITY": affinity, "GOMP_CPU_AFFINITY": affinity,
        "SYSHAX_QUANTIZE": quant, "NRC": str(nrc), "HOME": "/tmp"}
    # Guaranteed QoS with integer CPUs: exclusive cores from the static CPU manager.
    assert cpu["resources"]["requests"] == cpu["resources"]["limits"] == {
        "cpu": str(cpus), "memory": memory}
    assert decode["status"]["qosClass"] == "Guaranteed"
    # sameNode: the decode pod runs on the prefill pod's Kunpeng server.
    assert decode["spec"]["nodeName"] == prefill["spec"]["nodeName"] == "kunpeng-a100-0"


def check_syshax_q8(cluster, ns, name):
    check_syshax(cluster, ns, name, cpus=160, affinity="0-159", quant="q8_0", nrc=2,
                 memory="128Gi")


def check_syshax_q4(cluster, ns, name):
    check_syshax(cluster, ns, name, cpus=128, affinity="0-31,40-71,80-111,120-151",
                 quant="q4_0", nrc=4, memory="64Gi")


def check_gaudi(cluster, ns, name, *, args, cache_path, modules, cards=4,
                command=("bash", "scripts/start_gaudi_vllm_server.sh"),
                workdir="/workspace/vllm-fork", capabilities=("SYS_NICE",)):
    (pod,) = pods(cluster, ns, name, "prefill")
    engine = container(pod, "engine")
    assert engine["command"] == list(command)
    assert engine["workingDir"] == workdir
    assert engine["args"] == args
    limits = engine["resources"]["limits"]
    assert limits["habana.ai/gaudi"] == str(cards)
    # The host's 15000 pages of 2 MiB for 8 cards, shared per card.
    assert limits["hugepages-2Mi"] == f"{cards * 3750}Mi"
    # The seed's --cap-add=sys_nice acts only for root: the engine runs as root, as the
    # seed's image does, every other capability dropped; the router stays UID 1000.
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                         "add": list(capabilities)}
    assert engine["securityContext"]["runAsUser"] == 0
    assert container(pod, "router")["securityContext"]["runAsUser"] == 1000
    variables = env(engine)
    # The device plugin sets HABANA_VISIBLE_DEVICES to the cards it allocated.
    assert "HABANA_VISIBLE_DEVICES" not in variables
    assert variables["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert variables["PT_HPU_ENABLE_LAZY_COLLECTIVES"] == "true"
    assert variables.get("HABANA_VISIBLE_MODULES") == modules
    cache = volumes(pod)["recipe-cache"]["hostPath"]
    assert cache["path"].startswith("/var/lib/heteroserve/gaudi-recipe-cache/")
    assert mounts(engine)[cache_path] == "recipe-cache"
    # Warmup takes 10 min to 1 h: the startup probe allows an hour.
    probe = engine["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 3600
    assert pod["spec"]["nodeName"] == "gaudi2-0"


def check_gaudi_qwen(cluster, ns, name):
    check_gaudi(cluster, ns, name, cache_path="/data/warmup_cache", modules="0,1,2,3", args=[
        "-w", "/models/Qwen2-72B-Instruct", "-n", "4", "-m", "0,1,2,3", "-b", "128",
        "-i", "800,1024", "-o", "400,512", "-l", "8192", "-t", "8192", "-d", "bfloat16",
        "-p", "30001", "-u", "0.0.0.0", "-c", "/data/warmup_cache"])


def check_gaudi_ds70b(cluster, ns, name):
    check_gaudi(cluster, ns, name, cache_path="/data/70B_warmup_cache", modules=None, args=[
        "-w", "/data/hf_models/DeepSeek-R1-Distill-Llama-70B", "-n", "4", "-b", "128",
        "-i", "800,4096", "-o", "800,2048", "-l", "8192", "-t", "8192", "-d", "bfloat16",
        "-p", "30001", "-u", "0.0.0.0", "-c", "/data/70B_warmup_cache"])


def check_gaudi_r1_fp8(cluster, ns, name):
    """Seed 003, 3.1: start_vllm.sh -w ... -q -u ... -p 8688 -b 128 -l 16384 -c ..."""
    check_gaudi(cluster, ns, name, cache_path="/data/warmup_cache", modules=None, cards=8,
                command=("bash", "start_vllm.sh"), workdir="/workspace/vllm-fork/quickstart",
                capabilities=("SYS_NICE", "IPC_LOCK"),
                args=["-w", "/data/hf_models/DeepSeek-R1-0528-G2", "-q", "-u", "0.0.0.0",
                      "-p", "8688", "-b", "128", "-l", "16384", "-c", "/data/warmup_cache"])
    router = yaml.safe_load(get_json(cluster, "configmap", f"{name}-router", "-n", ns)[
        "data"]["router.yaml"])
    assert router["accelerator"]["urls"] == ["http://127.0.0.1:8688"]


def check_ksana(cluster, ns, name, *, resource, count, node):
    (pod,) = pods(cluster, ns, name, "prefill")
    engine = container(pod, "engine")
    assert engine["command"] == ["python", "serving_server.py"]
    assert engine["args"] == ["--config_file", "/etc/heteroserve/engine/ksana.yaml",
                              "--host", "0.0.0.0", "--port", "8080"]
    assert engine["resources"]["limits"][resource] == str(count)
    # No /health route in KsanaLLM: TCP probes; the router lists models at /models.
    assert "tcpSocket" in engine["readinessProbe"]
    config = yaml.safe_load(get_json(cluster, "configmap", f"{name}-engine", "-n", ns)[
        "data"]["ksana.yaml"])
    assert config["setting"]["global"] == {"tensor_para_size": count, "pipeline_para_size": 1}
    assert config["setting"]["block_manager"]["block_token_num"] == 16
    assert config["setting"]["batch_scheduler"]["max_token_len"] == 8192
    router = yaml.safe_load(get_json(cluster, "configmap", f"{name}-router", "-n", ns)[
        "data"]["router.yaml"])
    assert router["accelerator"]["modelsPath"] == "/models"
    assert pod["spec"]["nodeName"] == node
    # Root (its image's tree and log), never privileged; the router stays UID 1000.
    assert engine["securityContext"]["runAsUser"] == 0
    assert not engine["securityContext"].get("privileged")
    assert container(pod, "router")["securityContext"]["runAsUser"] == 1000
    return pod, engine, config


def check_ksana_ascend(cluster, ns, name):
    pod, engine, config = check_ksana(cluster, ns, name, resource="huawei.com/Ascend910",
                                      count=8, node="ascend-910-0")
    assert config["setting"]["batch_scheduler"]["max_batch_size"] == 64
    assert mounts(engine)["/usr/local/Ascend/driver"] == "ascend-driver"
    assert volumes(pod)["ascend-driver"]["hostPath"]["path"] == "/usr/local/Ascend/driver"
    assert "/etc/ascend_install.info" in mounts(engine)
    # Seed 004: npu-smi from /usr/local/sbin, the NPU logs under /var/log/npu (and /usr/slog).
    assert mounts(engine)["/usr/local/sbin/npu-smi"] == "npu-smi"
    assert volumes(pod)["npu-smi"]["hostPath"]["path"] == "/usr/local/sbin/npu-smi"
    assert mounts(engine)["/var/log/npu"] == mounts(engine)["/usr/slog"] == "npu-log"
    assert volumes(pod)["npu-log"]["hostPath"]["path"] == "/var/log/npu"
    # "Only Support Ascend NPU + X86 CPU" (seed 004).
    assert pod["spec"]["nodeSelector"] == {"node.kubernetes.io/npu.chip.name": "910B2C",
                                           "kubernetes.io/arch": "amd64"}
    assert engine["securityContext"]["capabilities"] == {"drop": ["ALL"],
                                                         "add": ["DAC_OVERRIDE"]}
    assert volumes(pod)["dshm"]["emptyDir"]["sizeLimit"] == "50Gi"


def check_ksana_nvidia(cluster, ns, name):
    check_ksana(cluster, ns, name, resource="nvidia.com/gpu", count=2, node="kunpeng-a100-0")


def check_sysinfer(cluster, ns, name):
    (pod,) = pods(cluster, ns, name, "decode")
    engine = container(pod, "engine")
    check_bound_from_the_grant(pod, engine, numa_nodes=4, per_node=22, seed_command=["./server"])
    assert engine["workingDir"] == "/app"
    assert engine["securityContext"] == {"allowPrivilegeEscalation": False,
                                         "readOnlyRootFilesystem": False,
                                         "capabilities": {"drop": ["ALL"]}}
    assert engine["args"] == ["/models/Baichuan2-13B-Chat-Q4_0.gguf", "-t", "0.0", "-n", "4096"]
    assert engine["ports"][0]["containerPort"] == 7860
    variables = env(engine)
    assert variables["OMP_NUM_THREADS"] == "88"
    # 22 physical cores on each of the 4 NUMA nodes of the 128-core/256-thread Kunpeng.
    assert variables["GOMP_CPU_AFFINITY"] == "0-21,32-53,64-85,96-117"
    # Only the binding: INFERENCE_OP_MODE, SYSHAX_QUANTIZE and NRC are sysHAX's.
    assert set(variables) == {"HOME", "OMP_NUM_THREADS", "GOMP_CPU_AFFINITY",
                              "CUSTOM_CPU_AFFINITY"}
    assert engine["resources"]["limits"]["cpu"] == "88"
    assert pod["spec"]["nodeName"] == "kunpeng-cpu-0"
    assert pod["status"]["qosClass"] == "Guaranteed"
    # CPU-only: the router sidecar lives in the decode pod, with a whole CPU of its own.
    assert container(pod, "router")["resources"]["limits"]["cpu"] == "1"


def check_builtin_cpu(cluster, ns, name):
    (pod,) = pods(cluster, ns, name, "decode")
    engine = container(pod, "engine")
    # heteroserve-bind derives the binding from the granted cpuset, in the plan's shape.
    assert engine["command"] == ["heteroserve-bind", "--numa-nodes", "1", "--threads-per-node",
                                 "4", "--", "heteroserve-cpu-engine"]
    assert env(engine)["OMP_NUM_THREADS"] == "4"
    assert env(engine)["SYSHAX_QUANTIZE"] == "q8_0"
    assert "NRC" not in env(engine)  # the builtin engine chooses by row width
    assert pod["status"]["qosClass"] == "Guaranteed"
    # anyNode prefers nodes without accelerators.
    assert pod["spec"]["nodeName"] in {"kunpeng-cpu-0", "x86-cpu-0", "x86-cpu-1"}
    # No prefill engine to pull KV from: no KV token.
    assert "--kv-token-file" not in engine["args"] and "kv-token" not in volumes(pod)


def check_builtin_pd(cluster, ns, name):
    (prefill,) = pods(cluster, ns, name, "prefill")
    decodes = pods(cluster, ns, name, "decode")
    assert len(decodes) == 2
    assert container(prefill, "engine")["args"][:6] == [
        "--model", "/opt/heteroserve/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "--served-model-name", "SmolLM2-135M-Instruct", "--device", "cuda"]
    for pod in decodes:
        assert env(container(pod, "engine"))["CUSTOM_CPU_AFFINITY"] == "0-3,16-19"
        assert pod["spec"]["nodeName"] in {"x86-cpu-0", "x86-cpu-1"}
    get_json(cluster, "poddisruptionbudget", f"{name}-decode", "-n", ns)
    router = yaml.safe_load(get_json(cluster, "configmap", f"{name}-router", "-n", ns)[
        "data"]["router.yaml"])
    assert router["cpu"]["urls"] == [f"http://{name}-decode.{ns}.svc:8002"]
    assert router["cpu"]["discovery"] == "dns"
    assert router["accelerator"]["urls"] == ["http://127.0.0.1:8001"]
    # The KV hand-off: both engines read the deployment's KV token Secret, the router splits.
    assert router["accelerator"]["kvExport"] is True and router["cpu"]["kvImport"] is True
    for pod in (prefill, *decodes):
        engine = container(pod, "engine")
        args = engine["args"]
        assert args[args.index("--kv-token-file") + 1] == "/etc/heteroserve/kv/token"
        assert mounts(engine)["/etc/heteroserve/kv"] == "kv-token"
        assert volumes(pod)["kv-token"]["secret"] == {"secretName": f"{name}-kv-token",
                                                      "defaultMode": 0o440}
    # The prefill engine advertises its pod IP for the pull (the router reaches it on loopback).
    engine = container(prefill, "engine")
    assert engine["args"][engine["args"].index("--kv-advertise-host") + 1] == "$(POD_IP)"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                         "fieldPath": "status.podIP"}}} \
        in engine["env"]


def check_builtin_pd_same_node(cluster, ns, name):
    """sysHAX's `--ipc container:` in Kubernetes: both engines in one pod, one memory-backed
    directory between them, no decode pods of their own."""
    (pod,) = pods(cluster, ns, name, "prefill")
    assert pods(cluster, ns, name, "decode") == []
    assert [c["name"] for c in pod["spec"]["containers"]] == ["engine", "decode-engine",
                                                               "router"]
    shared = volumes(pod)["kv-shm"]
    assert shared["emptyDir"] == {"medium": "Memory", "sizeLimit": "1025Mi"}
    assert not pod["spec"].get("hostIPC") and all(
        "hostPath" not in v for v in pod["spec"]["volumes"])
    for cname in ("engine", "decode-engine"):
        engine = container(pod, cname)
        assert mounts(engine)["/var/run/heteroserve/kv"] == "kv-shm"
        assert mounts(engine)["/etc/heteroserve/kv"] == "kv-token"
        args = engine["args"]
        assert args[args.index("--kv-shm-dir") + 1] == "/var/run/heteroserve/kv"
        assert args[args.index("--kv-token-file") + 1] == "/etc/heteroserve/kv/token"
    decode = container(pod, "decode-engine")
    assert decode["command"] == ["heteroserve-bind", "--numa-nodes", "2", "--threads-per-node",
                                 "4", "--", "heteroserve-cpu-engine"]
    assert env(decode)["CUSTOM_CPU_AFFINITY"] == "0-3,40-43"
    assert env(decode)["OMP_NUM_THREADS"] == "8"
    assert decode["resources"]["requests"] == decode["resources"]["limits"] == {
        "cpu": "8", "memory": "4Gi"}
    # The apiserver defaults the card's request to its limit.
    gpu = container(pod, "engine")["resources"]
    assert gpu["requests"] == gpu["limits"] == {"cpu": "7", "memory": "9217Mi",
                                                "nvidia.com/gpu": "1"}
    # Every container asks integer CPUs equal to its limits: exclusive cores for decode.
    assert pod["status"]["qosClass"] == "Guaranteed"
    assert pod["spec"]["nodeName"] == "kunpeng-a100-0"
    services = get_json(cluster, "services", "-n", ns, "-l",
                        f"app.kubernetes.io/instance={name}")["items"]
    assert [s["metadata"]["name"] for s in services] == [name]
    router = yaml.safe_load(get_json(cluster, "configmap", f"{name}-router", "-n", ns)[
        "data"]["router.yaml"])
    assert router["cpu"]["urls"] == ["http://127.0.0.1:8002"]
    assert router["cpu"]["kvImport"] is True and router["cpu"]["sameNode"] is True
    status = get_json(cluster, "inferencedeployment", name, "-n", ns)["status"]
    assert status["decode"] == {"replicas": 1, "readyReplicas": 1}


CHECKS = {
    "syshax-ds-32b": check_syshax_q8,
    "syshax-ds-32b-q4": check_syshax_q4,
    "gaudi-qwen2-72b": check_gaudi_qwen,
    "gaudi-ds-r1-distill-llama-70b": check_gaudi_ds70b,
    "gaudi-ds-r1-fp8": check_gaudi_r1_fp8,
    "ksana-ascend": check_ksana_ascend,
    "ksana-nvidia": check_ksana_nvidia,
    "sysinfer-baichuan2-13b": check_sysinfer,
    "builtin-smollm2-cpu": check_builtin_cpu,
    "builtin-gpu-prefill-cpu-decode": check_builtin_pd,
    "builtin-gpu-prefill-cpu-decode-same-node": check_builtin_pd_same_node,
}
KV_HANDOFF_SAMPLES = {"builtin-gpu-prefill-cpu-decode", "builtin-gpu-prefill-cpu-decode-same-node"}


def test_every_sample_has_checks():
    assert {p.stem for p in SAMPLES.glob("*.yaml")} == set(CHECKS)


@pytest.mark.parametrize("sample", sorted(CHECKS))
def test_sample_becomes_ready_with_seed_fields(cluster, operator, namespace, sample):
    path = SAMPLES / f"{sample}.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    obj = wait_ready(cluster, namespace, name)
    status = obj["status"]
    assert status["endpoint"] == f"http://{name}.{namespace}.svc:8010/v1"
    for kind in ("PrefillReady", "DecodeReady", "RouterReady"):
        assert any(c["type"] == kind and c["status"] == "True" for c in status["conditions"])
    CHECKS[sample](cluster, namespace, name)
    # Only heteroserve's own prefill + decode pair hands KV over, so only it gets a KV token.
    secrets = get_json(cluster, "secrets", "-n", namespace, "-l",
                       f"app.kubernetes.io/instance={name}")["items"]
    assert [s["metadata"]["name"] for s in secrets] == (
        [f"{name}-kv-token"] if sample in KV_HANDOFF_SAMPLES else [])
    # Deleting the sample frees its cards and cores for the next one.
    cluster.kubectl("delete", "inferencedeployment", name, "-n", namespace, "--wait=true")
    cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", namespace, "--timeout=60s")


def restricted(cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")


def test_the_same_node_pod_is_admitted_under_restricted_pod_security(cluster, operator,
                                                                       namespace):
    """The shared memory needs neither hostIPC nor a hostPath: Pod Security "restricted"
    admits the pod (and, as a control, refuses the same pod with hostIPC)."""
    restricted(cluster, namespace)
    path = SAMPLES / "builtin-gpu-prefill-cpu-decode-same-node.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    wait_ready(cluster, namespace, name)
    ns = namespace
    (pod,) = pods(cluster, ns, name, "prefill")
    assert "kv-shm" in volumes(pod)
    template = get_json(cluster, "deployment", f"{name}-prefill", "-n", ns)["spec"]["template"]
    bare = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "admission-probe", "namespace": ns},
            "spec": template["spec"]}
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(bare))
    bare["spec"] = {**template["spec"], "hostIPC": True}
    refused = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                              stdin=yaml.safe_dump(bare), check=False)
    assert refused.returncode != 0 and "hostIPC" in refused.stderr
    cluster.kubectl("delete", "inferencedeployment", name, "-n", ns, "--wait=true")
    cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", ns, "--timeout=60s")
