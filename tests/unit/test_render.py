"""Pure rendering: spec + cluster facts -> manifests, no cluster."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.api.quantity import QuantityError, parse_quantity
from heteroserve_operator.numa import NumaPlanError
from heteroserve_operator.reconcile import cluster_facts, is_subset
from heteroserve_operator.render.children import render
from heteroserve_operator.render.facts import ClusterFacts, topology_from_labels
from heteroserve_operator.render.meta import SPEC_HASH, Owner
from heteroserve_operator.status import compute_status, transitions
from tests.cluster.catalogue import load_catalogue
from tests.engine_profiles import PROFILES

OWNER = Owner("m", "ns", "uid-1")
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])


def spec(**overrides) -> InferenceDeploymentSpec:
    base = {"model": {"name": "m", "path": "/models/m"}, "decode": {"cpus": 4}}
    base.update(overrides)
    return InferenceDeploymentSpec.model_validate(base)


def by_kind(rendered) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for child in rendered.children:
        kinds.setdefault(child["kind"], []).append(child)
    return kinds


def test_every_child_is_owned_labelled_and_hashed():
    rendered = render(spec(), OWNER, FACTS)
    for child in rendered.children:
        meta = child["metadata"]
        assert meta["ownerReferences"] == [OWNER.reference()]
        assert meta["labels"]["heteroserve.io/inference-deployment"] == "m"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "heteroserve-operator"
        assert len(meta["annotations"][SPEC_HASH]) == 16


def test_rendering_is_deterministic_and_hash_tracks_the_spec():
    one = render(spec(), OWNER, FACTS).children
    assert one == render(spec(), OWNER, FACTS).children
    other = render(spec(decode={"cpus": 8}), OWNER, FACTS).children
    hashes = lambda children: {c["metadata"]["name"] + c["kind"]:  # noqa: E731
                               c["metadata"]["annotations"][SPEC_HASH] for c in children}
    assert hashes(one)["m-decodeDeployment"] != hashes(other)["m-decodeDeployment"]
    assert hashes(one)["mService"] == hashes(other)["mService"]


def test_ingress_and_service_type():
    rendered = render(spec(ingress={"enabled": True, "host": "llm.example.com",
                                    "className": "nginx", "tlsSecretName": "llm-tls"},
                           service={"type": "LoadBalancer", "port": 80}), OWNER, FACTS)
    (ingress,) = by_kind(rendered)["Ingress"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "llm.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "m",
                                                              "port": {"name": "http"}}
    service = next(s for s in by_kind(rendered)["Service"] if s["metadata"]["name"] == "m")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"][0]["port"] == 80
    assert rendered.endpoint == "http://m.ns.svc:80/v1"


def test_pdb_only_for_replicated_tiers():
    assert "PodDisruptionBudget" not in by_kind(render(spec(), OWNER, FACTS))
    (pdb,) = by_kind(render(spec(decode={"cpus": 4, "replicas": 3}), OWNER, FACTS))[
        "PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1


def test_restricted_pod_security_for_cpu_pods():
    (decode,) = by_kind(render(spec(), OWNER, FACTS))["Deployment"]
    pod = decode["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


def decode_env(rendered) -> dict[str, str]:
    (decode,) = by_kind(rendered)["Deployment"]
    container = decode["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


def test_nrc_reaches_the_builtin_engine_only_when_set():
    # Unset, the builtin engine chooses its rows per product by row width; the Kunpeng
    # guidance (4 with q4_0) would slow its wide-row products.
    assert "NRC" not in decode_env(render(spec(decode={"cpus": 4, "quantization": "q4_0"}),
                                          OWNER, FACTS))
    env = decode_env(render(spec(decode={"cpus": 4, "quantization": "q4_0", "gemv_tiling": 2}),
                            OWNER, FACTS))
    assert env["NRC"] == "2" and env["SYSHAX_QUANTIZE"] == "q4_0"


def test_same_node_needs_an_accelerator_node_with_room():
    too_big = spec(prefill={"accelerator": {"type": "nvidia", "count": 2},
                            "engine": {"kind": "vllm"}},
                   decode={"cpus": 200, "placement": "sameNode"})
    with pytest.raises(NumaPlanError, match="no node can hold a decode pod of 200 CPUs next to "
                                            "the prefill accelerators"):
        render(too_big, OWNER, FACTS)


def test_without_any_published_topology_the_engine_replans():
    rendered = render(spec(decode={"cpus": 4, "numaNodes": 2}), OWNER, ClusterFacts())
    assert rendered.placement.nodes == ()
    assert rendered.placement.plan.cpu_list == "0-3"
    assert rendered.placement.plan.threads == 4


def test_topology_from_labels():
    topology = topology_from_labels("n", {"heteroserve.io/numa-nodes": "2",
                                          "heteroserve.io/cpus-per-numa-node": "8",
                                          "feature.node.kubernetes.io/cpu-hardware_multithreading":
                                          "true"})
    assert [n.cpus for n in topology.numa_nodes] == [(0, 1, 2, 3, 8, 9, 10, 11),
                                                    (4, 5, 6, 7, 12, 13, 14, 15)]
    assert topology_from_labels("n", {}) is None


def test_field_subset_drift_check():
    desired = {"spec": {"replicas": 2, "template": {"containers": [{"name": "a", "env": []}]}}}
    live = {"spec": {"replicas": 2, "paused": False,
                     "template": {"containers": [{"name": "a", "env": [],
                                                  "terminationMessagePath": "/x"}]}}}
    assert is_subset(desired, live)
    live["spec"]["replicas"] = 5
    assert not is_subset(desired, live)
    assert not is_subset({"a": [1, 2]}, {"a": [1]})


def test_drift_check_compares_quantities_by_value():
    """The apiserver stores `1.5Gi` as `1536Mi`: the same value is no drift, another one is."""
    (decode,) = by_kind(render(spec(decode={"cpus": 4, "memory": "1.5Gi"}), OWNER, FACTS))[
        "Deployment"]
    live = copy.deepcopy(decode)
    container = live["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == "1.5Gi"
    container["resources"] = {"limits": {"cpu": "4", "memory": "1536Mi"},
                              "requests": {"cpu": "4000m", "memory": "1610612736"}}
    shm = next(v for v in live["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    shm["emptyDir"]["sizeLimit"] = "1024Mi"
    assert is_subset(decode, live)
    container["resources"]["limits"]["memory"] = "1537Mi"
    assert not is_subset(decode, live)
    container["resources"]["limits"]["memory"] = "1536Mi"
    shm["emptyDir"]["sizeLimit"] = "2Gi"
    assert not is_subset(decode, live)
    # Only quantity fields compare by value: an env value "1k" is not "1000".
    assert not is_subset({"env": [{"name": "X", "value": "1000"}]},
                         {"env": [{"name": "X", "value": "1k"}]})


@pytest.mark.parametrize(("text", "value"), [
    ("1.5Gi", 1610612736), ("1536Mi", 1610612736), ("500m", Decimal("0.5")), ("1e3", 1000),
    ("1E-3", Decimal("0.001")), ("2k", 2000), ("0", 0), (".5", Decimal("0.5")),
    ("999999999Ei", 999999999 * 2**60)])
def test_quantities_parse_to_exact_values(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1.5GiB", "1 Gi", "1.2.3", "0x10", "1ki"])
def test_malformed_quantities_are_refused(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_status_conditions_and_transition_events():
    from heteroserve_operator.status import Observed

    s = spec()
    waiting = compute_status(s, 1, {}, "t0", endpoint="e", observed=Observed(
        decode={"metadata": {"generation": 1},
                "status": {"observedGeneration": 1, "readyReplicas": 0}}))
    ready_cond = next(c for c in waiting["conditions"] if c["type"] == "Ready")
    assert ready_cond["status"] == "False" and "DecodeReady" in ready_cond["message"]
    ready = compute_status(s, 1, waiting, "t1", endpoint="e", observed=Observed(
        decode={"metadata": {"generation": 1}, "status": {
            "observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 1}},
        router_ready_endpoints=1))
    assert next(c for c in ready["conditions"] if c["type"] == "Ready")["status"] == "True"
    # Unchanged conditions keep their transition time.
    prefill = next(c for c in ready["conditions"] if c["type"] == "PrefillReady")
    assert prefill["lastTransitionTime"] == "t0"
    # One Normal Event for the deployment turning Ready; the tiers' transitions are in the
    # status only.
    assert transitions(waiting, ready) == [("Normal", "Ready", "serving")]
    failed = compute_status(s, 2, ready, "t2", error=("NumaPlanFailed", "rule"))
    assert ("Warning", "NumaPlanFailed", "rule") in transitions(ready, failed)
    assert failed["endpoint"] == "e"  # kept while degraded


@pytest.mark.parametrize("sample", sorted(
    p.stem for p in (__import__("pathlib").Path(__file__).parents[2] / "crds" / "samples")
    .glob("*.yaml")))
def test_every_rendered_child_is_a_possible_child(sample):
    """The reconciler reads (and prunes) children by these names only."""
    import yaml

    from heteroserve_operator.render.children import possible_children

    path = __import__("pathlib").Path(__file__).parents[2] / "crds" / "samples" / f"{sample}.yaml"
    document = yaml.safe_load(path.read_text())
    owner = Owner(document["metadata"]["name"], "ns", "u")
    rendered = render(InferenceDeploymentSpec.model_validate(document["spec"]), owner, FACTS)
    keys = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in rendered.children}
    assert keys <= set(possible_children(owner.name))


# -- the KV hand-off token ------------------------------------------------------------------------

GPU = {"type": "nvidia", "count": 1}
PAIRS = {  # (prefill engine, decode engine): hands KV over
    ("builtin", "builtin"): True,
    ("vllm", "builtin"): False,
    ("ksana", "builtin"): False,
    ("builtin", "vllm-cpu"): False,
    ("builtin", "sysinfer"): False,
    ("vllm", "vllm-cpu"): False,
}


def pair(prefill_kind: str, decode_kind: str) -> InferenceDeploymentSpec:
    return spec(prefill={"accelerator": GPU, "engine": {"kind": prefill_kind}},
                decode={"cpus": 4, "engine": {"kind": decode_kind}})


def pod_specs(rendered) -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in by_kind(rendered)["Deployment"]}


def engine_of(pod: dict) -> dict:
    return next(c for c in pod["containers"] if c["name"] == "engine")


def router_document(rendered) -> dict:
    import yaml

    (configmap,) = [c for c in by_kind(rendered)["ConfigMap"]
                    if c["metadata"]["name"] == "m-router"]
    return yaml.safe_load(configmap["data"]["router.yaml"])


@pytest.mark.parametrize(("kinds", "handoff"), PAIRS.items(), ids=["+".join(k) for k in PAIRS])
def test_only_builtin_pairs_mount_the_kv_token_and_hand_kv_over(kinds, handoff):
    rendered = render(pair(*kinds), OWNER, FACTS)
    document = router_document(rendered)
    assert document["accelerator"]["kvExport"] is handoff
    assert document["cpu"]["kvImport"] is handoff
    assert rendered.kv_token_secret == ("m-kv-token" if handoff else None)
    for pod in pod_specs(rendered).values():
        engine = engine_of(pod)
        volumes = {v["name"]: v for v in pod["volumes"]}
        if not handoff:
            assert "--kv-token-file" not in engine["args"]
            assert "kv-token" not in volumes
            continue
        at = engine["args"].index("--kv-token-file")
        assert engine["args"][at + 1] == "/etc/heteroserve/kv/token"
        # root:fsGroup r--r-----: the engine's user (UID and GID 1000, fsGroup 1000) reads it.
        assert volumes["kv-token"] == {"name": "kv-token", "secret": {
            "secretName": "m-kv-token", "defaultMode": 0o440}}
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"] == 1000
        assert {"name": "kv-token", "mountPath": "/etc/heteroserve/kv",
                "readOnly": True} in engine["volumeMounts"]
        # The router sidecar holds no token.
        for container in pod["containers"]:
            if container["name"] != "engine":
                assert all(m["name"] != "kv-token" for m in container["volumeMounts"])


@pytest.mark.parametrize(("kinds", "handoff"), PAIRS.items(), ids=["+".join(k) for k in PAIRS])
def test_the_exporting_engine_advertises_its_pod_ip(kinds, handoff):
    """The router sidecar reaches the prefill engine on loopback; the decode engine, in
    another pod, pulls the KV from the address the engine advertises: its pod IP, from the
    downward API."""
    rendered = render(pair(*kinds), OWNER, FACTS)
    prefill = engine_of(pod_specs(rendered)["m-prefill"])
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    if not handoff:
        assert "--kv-advertise-host" not in prefill["args"] and pod_ip not in prefill["env"]
        return
    at = prefill["args"].index("--kv-advertise-host")
    assert prefill["args"][at + 1] == "$(POD_IP)" and pod_ip in prefill["env"]
    decode = engine_of(pod_specs(rendered)["m-decode"])
    assert "--kv-advertise-host" not in decode["args"]


def test_cpu_only_and_accelerator_only_deployments_have_no_kv_token():
    cpu_only = render(spec(), OWNER, FACTS)
    assert cpu_only.kv_token_secret is None
    assert router_document(cpu_only)["cpu"]["kvImport"] is False
    assert "--kv-token-file" not in engine_of(next(iter(pod_specs(cpu_only).values())))["args"]
    accelerator_only = render(spec(prefill={"accelerator": GPU, "engine": {"kind": "builtin"}},
                                   decode=None), OWNER, FACTS)
    assert accelerator_only.kv_token_secret is None
    assert router_document(accelerator_only)["accelerator"]["kvExport"] is False


def test_the_kv_token_value_is_never_rendered():
    """The desired children name the Secret; its value is made by the reconciler alone, so a
    re-render cannot rotate it and no spec hash, ConfigMap or pod spec carries it."""
    import json

    from heteroserve_operator.render import kv_token

    rendered = render(pair("builtin", "builtin"), OWNER, FACTS)
    assert "Secret" not in by_kind(rendered)
    text = json.dumps(rendered.children)
    assert "stringData" not in text and '"data": {"token"' not in text
    assert rendered.children == render(pair("builtin", "builtin"), OWNER, FACTS).children
    secret = kv_token.secret(OWNER, "a-value-made-by-the-reconciler")
    assert secret["metadata"]["name"] == rendered.kv_token_secret
    assert secret["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert secret["stringData"] == {"token": "a-value-made-by-the-reconciler"}


# -- seed details (issue 13) ----------------------------------------------------------------------

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"


def sample_spec(name: str) -> InferenceDeploymentSpec:
    return InferenceDeploymentSpec.model_validate(
        yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())["spec"])


def tier_engine(rendered, component: str) -> tuple[dict, dict]:
    """(pod spec, engine container) of the component's Deployment."""
    deployment = next(d for d in by_kind(rendered)["Deployment"]
                      if d["metadata"]["name"] == f"{OWNER.name}-{component}")
    pod = deployment["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "engine")


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


def gaudi(**engine) -> InferenceDeploymentSpec:
    return spec(prefill={"accelerator": {"type": "gaudi", "count": 4},
                         "engine": {"kind": "vllm-gaudi", "maxNumSeqs": 128, **engine}},
                decode=None, router={"policy": "accelerator"})


def recipe_cache(rendered) -> str:
    pod, _engine = tier_engine(rendered, "prefill")
    volume = next(v for v in pod["volumes"] if v["name"] == "recipe-cache")
    return volume["hostPath"]["path"]


def test_gaudi_leaves_visible_devices_to_the_device_plugin():
    """The plugin sets HABANA_VISIBLE_DEVICES to the cards it allocated; `all` would hand the pod
    every card of the node."""
    for name in ("gaudi-qwen2-72b", "gaudi-ds-r1-distill-llama-70b", "gaudi-ds-r1-fp8"):
        _pod, engine = tier_engine(render(sample_spec(name), OWNER, FACTS), "prefill")
        variables = env_of(engine)
        assert "HABANA_VISIBLE_DEVICES" not in variables
        assert variables["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"


def test_gaudi_restarts_with_skip_or_reduced_warmup_reuse_the_recipe_cache():
    full = recipe_cache(render(gaudi(warmup={"recipeCache": True}), OWNER, FACTS))
    assert full.startswith("/var/lib/heteroserve/gaudi-recipe-cache/")
    # Seed 003, 2.2: a second start adds -s, or -r with the hot batch size and length, on the
    # cache the first one filled; where it listens or which modules it uses compiles nothing new.
    for same in (gaudi(warmup={"recipeCache": True, "skip": True}),
                 gaudi(warmup={"recipeCache": True, "reducedMaxBatchSize": 8,
                               "reducedMaxSeqLen": 24000}),
                 gaudi(warmup={"recipeCache": True, "recipeCachePath": "/data/other"}),
                 gaudi(warmup={"recipeCache": True}, port=30002)):
        assert recipe_cache(render(same, OWNER, FACTS)) == full
    moved = spec(prefill={"accelerator": {"type": "gaudi", "count": 4, "moduleIds": [4, 5, 6, 7]},
                          "engine": {"kind": "vllm-gaudi", "maxNumSeqs": 128,
                                     "warmup": {"recipeCache": True}}},
                 decode=None, router={"policy": "accelerator"})
    assert recipe_cache(render(moved, OWNER, FACTS)) == full
    # What the recipes are compiled for changes the key.
    for other in (gaudi(warmup={"recipeCache": True}, maxNumSeqs=64),
                  gaudi(warmup={"recipeCache": True}, inputRange={"min": 4, "max": 2048}),
                  gaudi(warmup={"recipeCache": True}, image="registry.example/vllm-gaudi:2"),
                  gaudi(warmup={"recipeCache": True}, args=["--enable-prefix-caching"])):
        assert recipe_cache(render(other, OWNER, FACTS)) != full


def test_gaudi_deepseek_r1_fp8_on_eight_cards_runs_start_vllm():
    """Seed 003, 3.1: `bash start_vllm.sh -w /data/hf_models/DeepSeek-R1-0528-G2 -q -u ...
    -p 8688 -b 128 -l 16384 -c /data/warmup_cache` from vllm-fork/quickstart."""
    fp8 = sample_spec("gaudi-ds-r1-fp8")
    rendered = render(fp8, OWNER, FACTS)
    _pod, engine = tier_engine(rendered, "prefill")
    assert engine["command"] == ["bash", "start_vllm.sh"]
    assert engine["workingDir"] == "/workspace/vllm-fork/quickstart"
    assert engine["args"] == ["-w", "/data/hf_models/DeepSeek-R1-0528-G2", "-q",
                              "-u", "0.0.0.0", "-p", "8688", "-b", "128", "-l", "16384",
                              "-c", "/data/warmup_cache"]
    assert engine["ports"][0]["containerPort"] == 8688
    assert engine["resources"]["limits"]["habana.ai/gaudi"] == "8"
    assert engine["resources"]["limits"]["hugepages-2Mi"] == "30000Mi"
    assert engine["image"] == fp8.prefill.engine.image
    assert {"name": "recipe-cache", "mountPath": "/data/warmup_cache"} in engine["volumeMounts"]
    # The restart the seed suggests (skip warmup) finds the same cache.
    skip = fp8.model_copy(update={"prefill": fp8.prefill.model_copy(update={
        "engine": fp8.prefill.engine.model_copy(update={
            "warmup": fp8.prefill.engine.warmup.model_copy(update={"skip": True})})})})
    skipped = render(skip, OWNER, FACTS)
    assert tier_engine(skipped, "prefill")[1]["args"][-1] == "-s"
    assert recipe_cache(skipped) == recipe_cache(rendered)
    # The same flags through the other script do not share its cache.
    plain = gaudi(warmup={"recipeCache": True})
    assert recipe_cache(render(plain, OWNER, FACTS)) != recipe_cache(rendered)


def test_sysinfer_gets_only_the_binding_variables():
    _pod, engine = tier_engine(render(sample_spec("sysinfer-baichuan2-13b"), OWNER, FACTS),
                             "decode")
    variables = env_of(engine)
    assert set(variables) == {"HOME", "OMP_NUM_THREADS", "CUSTOM_CPU_AFFINITY",
                              "GOMP_CPU_AFFINITY"}
    assert variables["OMP_NUM_THREADS"] == "88"
    # The sysHAX engines keep their knobs.
    _pod, syshax = tier_engine(render(sample_spec("syshax-ds-32b-q4"), OWNER, FACTS), "decode")
    assert {"INFERENCE_OP_MODE", "SYSHAX_QUANTIZE", "NRC"} <= set(env_of(syshax))


def test_ascend_mounts_npu_smi_from_sbin_and_the_npu_logs():
    """Seed 004's NPU `docker run`: -v /usr/local/sbin/npu-smi:/usr/local/sbin/npu-smi,
    -v /var/log/npu/...:/var/log/npu/... and -v /var/log/npu/:/usr/slog."""
    pod, engine = tier_engine(render(sample_spec("ksana-ascend"), OWNER, FACTS), "prefill")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert volumes["npu-smi"]["hostPath"]["path"] == "/usr/local/sbin/npu-smi"
    assert mounts["/usr/local/sbin/npu-smi"]["readOnly"] is True
    assert not any(path.startswith("/usr/local/bin") for path in mounts)
    assert volumes["npu-log"]["hostPath"]["path"] == "/var/log/npu"
    for path in ("/var/log/npu", "/usr/slog"):
        assert mounts[path]["name"] == "npu-log" and "readOnly" not in mounts[path]
    assert mounts["/usr/local/Ascend/driver"]["readOnly"] is True


def false_read_only(node, where: str = "") -> list[str]:
    """Where a readOnly: false sits: the apiserver drops it (a plain bool, omitempty), so the
    drift check would see a difference on every reconcile."""
    if isinstance(node, dict):
        return [*([where] if node.get("readOnly") is False else []),
                *(hit for key, value in node.items()
                  for hit in false_read_only(value, f"{where}.{key}"))]
    if isinstance(node, list):
        return [hit for i, item in enumerate(node)
                for hit in false_read_only(item, f"{where}[{i}]")]
    return []


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_no_profile_renders_a_false_read_only(profile):
    children = render(PROFILES[profile][0], OWNER, FACTS).children
    assert false_read_only(children) == []


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.yaml")))
def test_no_sample_renders_a_false_read_only(sample):
    assert false_read_only(render(sample_spec(sample), OWNER, FACTS).children) == []


# -- the same-node pod: both builtin engines in one pod, sharing memory ---------------------------

def same_node_spec(**decode) -> InferenceDeploymentSpec:
    return spec(model={"name": "m", "path": "/models/m.gguf", "maxModelLen": 2048},
                prefill={"accelerator": GPU, "engine": {"kind": "builtin"}, "memory": "8Gi"},
                decode={"cpus": 8, "numaNodes": 2, "reservedCpusPerNumaNode": 4,
                        "memory": "4Gi", "placement": "sameNode",
                        "engine": {"kind": "builtin"}, **decode})


def containers_of(pod: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod["containers"]}


def test_same_node_builtin_pair_runs_both_engines_in_the_prefill_pod():
    rendered = render(same_node_spec(), OWNER, FACTS)
    kinds = by_kind(rendered)
    # No decode Deployment, headless Service or budget: the prefill pods carry the decode engine.
    assert [d["metadata"]["name"] for d in kinds["Deployment"]] == ["m-prefill"]
    assert [s["metadata"]["name"] for s in kinds["Service"]] == ["m"]
    assert "PodDisruptionBudget" not in kinds
    pod = pod_specs(rendered)["m-prefill"]
    containers = containers_of(pod)
    assert list(containers) == ["engine", "decode-engine", "router"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    # 1 GiB KV cache + 16 prompts in flight x (8 x 2048 + 4096) bytes of framing, in whole MiB.
    assert volumes["kv-shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1025Mi"}
    assert volumes["decode-dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
    for name in ("engine", "decode-engine"):
        engine = containers[name]
        assert {"name": "kv-shm", "mountPath": "/var/run/heteroserve/kv"} in engine[
            "volumeMounts"]
        at = engine["args"].index("--kv-shm-dir")
        assert engine["args"][at + 1] == "/var/run/heteroserve/kv"
        assert "--kv-token-file" in engine["args"]
        assert any(m["name"] == "kv-token" for m in engine["volumeMounts"])
    assert containers["engine"]["command"] == ["heteroserve-prefill-engine"]
    decode = containers["decode-engine"]
    assert decode["command"][-2:] == ["--", "heteroserve-cpu-engine"]
    assert decode["command"][0] == "heteroserve-bind"
    assert {m["mountPath"]: m["name"] for m in decode["volumeMounts"]}["/dev/shm"] == \
        "decode-dshm"
    # The router holds neither the token nor the channel.
    assert {m["name"] for m in containers["router"]["volumeMounts"]} == {"router-config"}
    # One IPC namespace: no hostIPC, no host path, restricted security contexts.
    assert "hostIPC" not in pod and all("hostPath" not in v for v in pod["volumes"])
    for container in containers.values():
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # Port names are unique in a pod: the decode engine's probes use its own.
    assert decode["ports"] == [{"name": "decode", "containerPort": 8002, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert decode[probe]["httpGet"]["port"] == "decode"
    # The router reaches the decode engine beside it: the hand-off stays in the pod.
    document = router_document(rendered)
    assert document["cpu"]["urls"] == ["http://127.0.0.1:8002"]
    assert document["cpu"]["discovery"] == "static" and document["cpu"]["sameNode"] is True
    assert document["cpu"]["kvImport"] is True and document["accelerator"]["kvExport"] is True


def test_the_same_node_pod_is_guaranteed_with_the_decode_engine_pinned():
    rendered = render(same_node_spec(), OWNER, FACTS)
    (deployment,) = by_kind(rendered)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    containers = containers_of(pod)
    # Guaranteed QoS (static CPU manager: exclusive cores) needs integer CPUs and memory with
    # requests equal to limits in every container.
    for container in containers.values():
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        assert {k: limits[k] for k in requests} == requests
        assert set(requests) == {"cpu", "memory"} and requests["cpu"].isdigit()
    decode = containers["decode-engine"]
    assert decode["resources"]["requests"] == {"cpu": "8", "memory": "4Gi"}
    env = {e["name"]: e["value"] for e in decode["env"]}
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["CUSTOM_CPU_AFFINITY"] == env["GOMP_CPU_AFFINITY"] == "0-3,40-43"
    assert deployment["spec"]["template"]["metadata"]["annotations"][
        "heteroserve.io/numa-plan"] == "0-3,40-43"
    # The 4 reserved cores of each of the 2 NUMA nodes: 7 for the prefill engine, 1 router.
    prefill = containers["engine"]["resources"]
    assert prefill["requests"]["cpu"] == "7" and containers["router"]["resources"][
        "requests"]["cpu"] == "1"
    # The channel's pages are charged to the prefill engine, which writes them: 8Gi + 1025Mi.
    assert prefill["requests"]["memory"] == prefill["limits"]["memory"] == "9217Mi"
    assert prefill["limits"]["nvidia.com/gpu"] == "1"
    # On the GPU node the plan holds on.
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["kunpeng-a100-0"]
    assert rendered.placement.nodes == ("kunpeng-a100-0",)


def test_same_node_decode_scales_with_the_prefill_pods():
    rendered = render(spec(prefill={"accelerator": GPU, "engine": {"kind": "builtin"},
                                    "replicas": 2},
                           decode={"cpus": 8, "placement": "sameNode", "replicas": 2,
                                   "engine": {"kind": "builtin"}}), OWNER, FACTS)
    (deployment,) = by_kind(rendered)["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert [b["metadata"]["name"] for b in by_kind(rendered)["PodDisruptionBudget"]] == [
        "m-prefill"]
    with pytest.raises(NumaPlanError, match=r"decode.replicas is 3 but prefill.replicas is 1: "
                                            r".*must equal prefill.replicas"):
        render(same_node_spec(replicas=3), OWNER, FACTS)


def test_the_same_node_pod_needs_a_node_with_cores_for_all_three():
    # kunpeng-a100-0 has 160 CPUs: 150 for decode leaves too few for 4 x 4 reserved.
    with pytest.raises(NumaPlanError, match=r"decode pod of 152 CPUs \(a pod of 168 with the "
                                            r"prefill engine and router\)"):
        render(same_node_spec(cpus=152, numaNodes=4), OWNER, FACTS)


def test_the_channel_holds_the_decode_engines_kv_cache_plus_framing():
    from heteroserve_operator.render import same_node

    big = same_node_spec(engine={"kind": "builtin", "args": ["--kv-cache-gib", "2.5"]})
    big = big.model_copy(update={"router": big.router.model_copy(update={
        "offload": big.router.offload.model_copy(update={"cpu_max_batch_size": 4})})})
    expected = 2.5 * 2**30 + 4 * (8 * 2048 + 4096)
    assert same_node.channel_bytes(big) == -(-expected // 2**20) * 2**20
    pod = pod_specs(render(big, OWNER, FACTS))["m-prefill"]
    assert {v["name"]: v for v in pod["volumes"]}["kv-shm"]["emptyDir"]["sizeLimit"] == "2561Mi"
    equals = same_node_spec(engine={"kind": "builtin", "args": ["--kv-cache-gib=3"]})
    assert same_node.channel_bytes(equals) == 3 * 2**30 + 2**20
    with pytest.raises(NumaPlanError, match="--kv-cache-gib lots is not a number"):
        render(same_node_spec(engine={"kind": "builtin", "args": ["--kv-cache-gib", "lots"]}),
               OWNER, FACTS)


def test_the_channel_default_is_the_cpu_engines_kv_cache_default():
    from heteroserve_engines.cpu_engine.__main__ import build_parser
    from heteroserve_operator.render import same_node

    assert build_parser().get_default("kv_cache_gib") == same_node.CPU_ENGINE_KV_CACHE_GIB


@pytest.mark.parametrize("kinds", [("vllm", "vllm-cpu"), ("builtin", "vllm-cpu"),
                                   ("vllm", "builtin")], ids="+".join)
def test_other_same_node_pairs_keep_a_decode_deployment_with_pod_affinity(kinds):
    rendered = render(spec(prefill={"accelerator": GPU, "engine": {"kind": kinds[0]}},
                           decode={"cpus": 8, "placement": "sameNode",
                                   "engine": {"kind": kinds[1]}}), OWNER, FACTS)
    pods = pod_specs(rendered)
    assert set(pods) == {"m-prefill", "m-decode"}
    assert "podAffinity" in pods["m-decode"]["affinity"]
    for pod in pods.values():
        assert "kv-shm" not in {v["name"] for v in pod["volumes"]}
        assert all("--kv-shm-dir" not in c.get("args", []) for c in pod["containers"])
    assert router_document(rendered)["cpu"]["discovery"] == "dns"


def test_the_builtin_pair_on_any_node_hands_kv_over_tcp():
    rendered = render(same_node_spec(placement="anyNode", reservedCpusPerNumaNode=0),
                      OWNER, FACTS)
    pods = pod_specs(rendered)
    assert set(pods) == {"m-prefill", "m-decode"}
    for pod in pods.values():
        assert "--kv-shm-dir" not in engine_of(pod)["args"]
        assert "--kv-token-file" in engine_of(pod)["args"]


def test_same_node_status_counts_decode_engines_in_the_prefill_pods():
    from heteroserve_operator.status import Observed

    s = same_node_spec()
    prefill = {"metadata": {"generation": 1}, "status": {
        "observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 1}}
    status = compute_status(s, 1, {}, "t0", endpoint="e", observed=Observed(
        prefill=prefill, router_ready_endpoints=1))
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["DecodeReady"]["status"] == "True"
    assert "placement sameNode" in conditions["DecodeReady"]["message"]
    assert conditions["Ready"]["status"] == "True"
    assert status["decode"] == {"replicas": 1, "readyReplicas": 1}
    starting = compute_status(s, 1, {}, "t0", endpoint="e", observed=Observed(
        prefill={**prefill, "status": {"observedGeneration": 1, "readyReplicas": 0}},
        router_ready_endpoints=0))
    assert {c["type"]: c["status"] for c in starting["conditions"]}["DecodeReady"] == "False"


def test_the_builtin_cpu_engine_binds_inside_its_container_in_the_plans_shape():
    """heteroserve-bind in front of the builtin decode engine: the binding comes from the
    cpuset the kubelet grants, checked against the plan's NUMA nodes and CPUs per node (two
    replicas on one node must not both bind the plan's first CPUs). Other engines' images have
    no entrypoint: they run the same code as a zipapp (tests/unit/test_engine_security.py)."""
    from heteroserve_operator.numa import NumaPlan
    from heteroserve_operator.render.engines.builtin import bind_command

    plan = NumaPlan("n", ((0, (0, 1, 2, 3)), (1, (40, 41, 42, 43))))
    assert bind_command(plan) == ["heteroserve-bind", "--numa-nodes", "2",
                                  "--threads-per-node", "4", "--"]
    for rendered_spec, wrapper in ((spec(), ["heteroserve-bind"]),
                                   (pair("vllm", "vllm-cpu"),
                                    ["python3", "/var/run/heteroserve/bind/heteroserve-bind.pyz"])):
        decode = engine_of(pod_specs(render(rendered_spec, OWNER, FACTS))["m-decode"])
        assert decode["command"][:len(wrapper)] == wrapper
        # The plan's binding stays in the env: the fallback, and what `heteroserve run` uses.
        assert "CUSTOM_CPU_AFFINITY" in {e["name"] for e in decode["env"]}
