"""Each engine profile's security context (issue 13): restricted for heteroserve's images and for
every engine that runs so; the seeds' exceptions reduced to what their images need, and the Pod
Security level that follows. docs/security.md lists the same table."""

from __future__ import annotations

import pytest

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.reconcile import cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.engines import bind_wrapper, ksana, vllm_cpu, vllm_gaudi
from heteroserve_operator.render.meta import Owner
from heteroserve_operator.render.security import (
    ASCEND_CANN,
    LEVELS,
    RESTRICTED,
    SecurityProfile,
    strictest_admitting,
)
from tests.cluster.catalogue import load_catalogue
from tests.engine_profiles import PROFILES

OWNER = Owner("m", "ns", "uid-1")
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])
RESTRICTED_ENGINE = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
                     "capabilities": {"drop": ["ALL"]}}
RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}


def pods(name: str) -> dict[str, dict]:
    """Deployment suffix -> pod spec, for a profile of tests/engine_profiles.py."""
    spec, _levels = PROFILES[name]
    return {d["metadata"]["name"].removeprefix("m-"): d["spec"]["template"]["spec"]
            for d in render(spec, OWNER, FACTS).children if d["kind"] == "Deployment"}


def with_prefill_engine(name: str, count: int | None = None, **engine
                        ) -> InferenceDeploymentSpec:
    spec, _levels = PROFILES[name]
    document = spec.model_dump(by_alias=True, exclude_none=True)
    document["prefill"]["engine"].update(engine)
    if count:
        document["prefill"]["accelerator"]["count"] = count
    return InferenceDeploymentSpec.model_validate(document)


def containers(pod: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod["containers"]}


def has_host_path(pod: dict) -> bool:
    return any("hostPath" in v for v in pod["volumes"])


def level_of(pod: dict, profile: SecurityProfile) -> str:
    return strictest_admitting(profile.level,
                               "privileged" if has_host_path(pod) else "restricted")


@pytest.mark.parametrize(("profile", "level"), [
    (RESTRICTED, "restricted"),
    (SecurityProfile(add_capabilities=("NET_BIND_SERVICE",)), "restricted"),
    (SecurityProfile(user=0), "baseline"),
    (SecurityProfile(add_capabilities=("DAC_OVERRIDE",)), "baseline"),
    (SecurityProfile(add_capabilities=("SYS_NICE",)), "privileged"),
    (SecurityProfile(seccomp="Unconfined"), "privileged"),
    (SecurityProfile(user=0, add_capabilities=("SYS_NICE", "IPC_LOCK")), "privileged"),
])
def test_the_pod_security_level_follows_from_the_profile(profile, level):
    assert profile.level == level


def test_accelerator_capabilities_join_the_engines_once():
    merged = vllm_gaudi.SECURITY.with_capabilities(("SYS_NICE",))
    assert merged.add_capabilities == ("SYS_NICE",)
    assert RESTRICTED.with_capabilities(("SYS_NICE",)).level == "privileged"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profiles_pods_need_the_level_the_docs_state(name):
    _spec, levels = PROFILES[name]
    rendered = pods(name)
    assert set(rendered) == set(levels)
    for suffix, pod in rendered.items():
        engine = containers(pod)["engine"]
        context = engine["securityContext"]
        # Never privileged, never privilege escalation, every capability dropped first.
        assert not context.get("privileged")
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        user = context.get("runAsUser", pod["securityContext"].get("runAsUser"))
        seccomp = context.get("seccompProfile", pod["securityContext"]["seccompProfile"])
        declared = SecurityProfile(user=user,
                                   add_capabilities=tuple(context["capabilities"].get("add", ())),
                                   seccomp=seccomp["type"])
        assert level_of(pod, declared) == levels[suffix], (suffix, declared)


@pytest.mark.parametrize("name", ["builtin", "vllm", "sysinfer"])
def test_restricted_profiles_render_todays_restricted_contexts(name):
    for pod in pods(name).values():
        assert pod["securityContext"] == RESTRICTED_POD
        for container in pod["containers"]:
            context = dict(container["securityContext"])
            context.pop("readOnlyRootFilesystem")
            assert context == {"allowPrivilegeEscalation": False,
                               "capabilities": {"drop": ["ALL"]}}, container["name"]


def test_syshax_cpu_keeps_uid_1000_and_only_leaves_seccomp_unconfined():
    """The seed's --privileged is for the NUMA binding: migrate_pages (never in the default
    seccomp profile) and set_mempolicy/get_mempolicy (there only with SYS_NICE) on the engine's
    own pages, which the kernel allows any process."""
    pod = pods("vllm-cpu")["decode"]
    assert pod["securityContext"] == RESTRICTED_POD
    engine = containers(pod)["engine"]
    assert engine["securityContext"] == {**RESTRICTED_ENGINE,
                                         "seccompProfile": {"type": "Unconfined"}}
    assert vllm_cpu.SECURITY.user == 1000 and vllm_cpu.SECURITY.reason


def test_gaudi_runs_as_root_with_sys_nice_and_its_recipe_cache_is_roots():
    """SYS_NICE acts only for UID 0 (no ambient capabilities in Kubernetes); the recipe cache is
    a hostPath the kubelet creates root:root 0755, so the engine's user, root, writes it."""
    cached = with_prefill_engine("vllm-gaudi", warmup={"recipeCache": True})
    deployment = next(d for d in render(cached, OWNER, FACTS).children
                      if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    engine, router = containers(pod)["engine"], containers(pod)["router"]
    assert engine["securityContext"] == {
        **RESTRICTED_ENGINE, "capabilities": {"drop": ["ALL"], "add": ["SYS_NICE"]},
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "privileged": False}
    cache = next(v for v in pod["volumes"] if v["name"] == "recipe-cache")
    assert cache["hostPath"]["type"] == "DirectoryOrCreate"
    assert any(m["name"] == "recipe-cache" and not m.get("readOnly")
               for m in engine["volumeMounts"])
    # The pod says no user: each container does; the router stays restricted, UID 1000.
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert router["securityContext"]["runAsUser"] == 1000
    assert router["securityContext"]["runAsNonRoot"] is True
    assert router["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert router["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_gaudi_start_vllm_adds_ipc_lock_for_the_eight_card_scale_out():
    assert vllm_gaudi.START_VLLM_SECURITY.add_capabilities == ("SYS_NICE", "IPC_LOCK")
    r1 = with_prefill_engine("vllm-gaudi", count=8, script="start_vllm",
                             image="registry.example/vllm-fork:deepseek_r1")
    (deployment,) = [d for d in render(r1, OWNER, FACTS).children if d["kind"] == "Deployment"]
    engine = containers(deployment["spec"]["template"]["spec"])["engine"]
    assert engine["securityContext"]["capabilities"]["add"] == ["SYS_NICE", "IPC_LOCK"]


@pytest.mark.parametrize(("name", "added", "arch"), [
    ("ksana-nvidia", None, None), ("ksana-ascend", ["DAC_OVERRIDE"], "amd64")])
def test_ksana_runs_as_root_not_privileged_and_its_npu_build_only_on_x86(name, added, arch):
    pod = pods(name)["prefill"]
    engine = containers(pod)["engine"]
    context = engine["securityContext"]
    assert context["runAsUser"] == 0 and context["privileged"] is False
    assert context["capabilities"].get("add") == added
    assert "seccompProfile" not in context  # the pod's RuntimeDefault
    assert pod.get("nodeSelector", {}).get(ksana.ARCH_LABEL) == arch
    assert containers(pod)["router"]["securityContext"]["runAsUser"] == 1000


def test_ksana_npu_pods_cannot_land_on_an_arm64_npu_host():
    """The arch label is a hard node selector: an arm64 host with the same NPUs is no
    candidate."""
    spec, _ = PROFILES["ksana-ascend"]
    (deployment,) = [d for d in render(spec, OWNER, FACTS).children if d["kind"] == "Deployment"]
    selector = deployment["spec"]["template"]["spec"]["nodeSelector"]
    arm = {"kubernetes.io/arch": "arm64", "node.kubernetes.io/npu.chip.name": "910B2C"}
    x86 = {**arm, "kubernetes.io/arch": "amd64"}
    matches = lambda labels: all(labels.get(k) == v for k, v in selector.items())  # noqa: E731
    assert not matches(arm) and matches(x86)


def test_vllm_ascend_shares_the_cann_profile():
    engine = containers(pods("vllm-ascend")["prefill"])["engine"]
    assert engine["securityContext"]["runAsUser"] == 0
    assert engine["securityContext"]["capabilities"]["add"] == list(
        ASCEND_CANN.add_capabilities)


# -- the binding from the container's own grant, for images without heteroserve-bind -------------

@pytest.mark.parametrize(("name", "seed_command"), [
    ("vllm-cpu", ["vllm", "serve", "/models/m"]), ("sysinfer", ["./server"])])
def test_foreign_cpu_images_bind_through_the_zipapp_an_init_container_writes(name, seed_command):
    pod = pods(name)["decode"]
    engine = containers(pod)["engine"]
    assert engine["command"] == ["python3", bind_wrapper.ZIPAPP, "--numa-nodes", "1",
                                 "--threads-per-node", "4", "--", *seed_command]
    (init,) = pod["initContainers"]
    assert init["image"] == "ghcr.io/heteroserve/cpu-engine:0.1.0"
    assert init["command"] == ["python", "-m", "heteroserve_engines.bind.zipapp",
                               bind_wrapper.ZIPAPP]
    # Restricted on itself, whatever the engine's profile.
    assert init["securityContext"] == {**RESTRICTED_ENGINE, "runAsNonRoot": True,
                                       "runAsUser": 1000, "runAsGroup": 1000,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    # Requests equal limits: the pod stays Guaranteed, the engine's cores exclusive.
    assert init["resources"]["requests"] == init["resources"]["limits"]
    volume = next(v for v in pod["volumes"] if v["name"] == bind_wrapper.VOLUME)
    assert "emptyDir" in volume
    assert {"name": bind_wrapper.VOLUME, "mountPath": bind_wrapper.DIRECTORY} in init[
        "volumeMounts"]
    assert {"name": bind_wrapper.VOLUME, "mountPath": bind_wrapper.DIRECTORY,
            "readOnly": True} in engine["volumeMounts"]
    # The plan's binding stays in the env: the fallback the wrapper replaces; sysHAX's knobs
    # pass through it.
    names = {e["name"] for e in engine["env"]}
    assert {"OMP_NUM_THREADS", "CUSTOM_CPU_AFFINITY", "GOMP_CPU_AFFINITY"} <= names
    assert ({"INFERENCE_OP_MODE", "SYSHAX_QUANTIZE", "NRC"} <= names) is (name == "vllm-cpu")


def test_heteroserves_own_cpu_image_needs_no_init_container():
    for pod in pods("builtin").values():
        assert "initContainers" not in pod
    decode = containers(pods("builtin")["decode"])["engine"]
    assert decode["command"][0] == bind_wrapper.ENTRYPOINT


def test_levels_are_ordered_strictest_first():
    assert LEVELS == ("restricted", "baseline", "privileged")
    assert strictest_admitting("restricted", "baseline") == "baseline"
