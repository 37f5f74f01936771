"""The router configuration contract: what the operator renders into the router ConfigMap is what
the router's own loader (`heteroserve_engines.router.settings`) reads, for every sample."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from heteroserve_engines.protocol.router_config import RouterConfig
from heteroserve_engines.router.settings import ConfigError, parse_config
from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.reconcile import cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import Owner
from heteroserve_operator.render.router_config import SAFE_DUMPER
from tests.cluster.catalogue import load_catalogue

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])


def rendered(sample: str) -> tuple[Owner, list[dict]]:
    document = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    owner = Owner(document["metadata"]["name"], "ns", "u")
    spec = InferenceDeploymentSpec.model_validate(document["spec"])
    return owner, render(spec, owner, FACTS).children


def router_text(owner: Owner, children: list[dict]) -> str:
    (configmap,) = [c for c in children if c["kind"] == "ConfigMap"
                    and c["metadata"]["name"] == f"{owner.name}-router"]
    return configmap["data"]["router.yaml"]


def load(sample: str) -> RouterConfig:
    owner, children = rendered(sample)
    return parse_config(router_text(owner, children), sample)


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.yaml")))
def test_every_sample_renders_a_config_the_router_loads_unchanged(sample):
    """Drift: every rendered key is one the loader knows (extra keys are errors) and no rendered
    value is lost on the way (a dropped key would load as its default)."""
    owner, children = rendered(sample)
    text = router_text(owner, children)
    config = parse_config(text, sample)
    assert yaml.safe_dump(config.model_dump(mode="json", by_alias=True), sort_keys=True) == text
    assert config.listen.host == "0.0.0.0"
    # The router is started on the file the ConfigMap is mounted as.
    routers = [c for d in children if d["kind"] == "Deployment"
               for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "router"]
    assert routers
    for router in routers:
        (mount,) = router["volumeMounts"]
        assert router["command"] == ["heteroserve-router"]
        assert router["args"] == ["--config", f"{mount['mountPath']}/router.yaml"]
        assert router["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert router["livenessProbe"]["httpGet"]["path"] == "/health"
        assert router["ports"][0]["containerPort"] == config.listen.port


def test_gpu_and_cpu_sample_finds_decode_pods_through_dns():
    config = load("builtin-gpu-prefill-cpu-decode")
    assert config.policy == "auto"
    assert config.model == "SmolLM2-135M-Instruct"
    assert config.accelerator.urls == ["http://127.0.0.1:8001"]
    assert config.accelerator.discovery == "static"
    assert config.cpu.urls == ["http://smollm2-pd-decode.ns.svc:8002"]
    assert config.cpu.discovery == "dns"
    assert not config.cpu.same_node  # anyNode
    assert config.cpu.max_concurrency == config.offload.cpu_max_batch_size == 16
    assert config.accelerator.served_model_name is None  # --served-model-name
    assert config.accelerator.health_path == "/health"
    assert config.accelerator.metrics_path == "/metrics"
    # heteroserve's own pair: prefill on the GPU, decode pulling the KV with the KV token.
    assert config.accelerator.kv_export and config.cpu.kv_import and config.kv_handoff


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.yaml")
                                          if not p.stem.startswith(
                                              "builtin-gpu-prefill-cpu-decode")))
def test_other_engines_neither_export_nor_import_kv(sample):
    """vLLM, KsanaLLM, sysInfer and a builtin engine without a builtin partner: the router
    sends requests whole."""
    config = load(sample)
    assert not config.kv_handoff
    assert not (config.accelerator and config.accelerator.kv_export)
    assert not (config.cpu and config.cpu.kv_import)


def test_same_node_builtin_sample_reaches_the_decode_engine_in_its_own_pod():
    config = load("builtin-gpu-prefill-cpu-decode-same-node")
    assert config.cpu.urls == ["http://127.0.0.1:8002"] and config.cpu.discovery == "static"
    assert config.cpu.same_node and config.kv_handoff


def test_syshax_sample_decodes_on_the_same_node():
    config = load("syshax-ds-32b")
    assert config.listen.port == 8010
    assert config.offload.kv_cache_usage_threshold == 0.9
    assert config.cpu.discovery == "dns" and config.cpu.same_node
    assert config.cpu.urls == ["http://ds-32b-decode.ns.svc:8002"]


@pytest.mark.parametrize("sample", ["builtin-smollm2-cpu", "sysinfer-baichuan2-13b"])
def test_cpu_only_samples_reach_the_engine_in_their_own_pod(sample):
    config = load(sample)
    assert config.policy == "cpu" and config.accelerator is None
    assert config.cpu.discovery == "static"
    assert config.cpu.urls[0].startswith("http://127.0.0.1:")


def test_sysinfer_has_no_health_or_metrics_route():
    config = load("sysinfer-baichuan2-13b")
    assert config.cpu.urls == ["http://127.0.0.1:7860"]
    assert config.cpu.health_path is None and config.cpu.metrics_path is None


@pytest.mark.parametrize("sample", ["ksana-nvidia", "ksana-ascend"])
def test_ksana_lists_models_without_v1_and_has_no_health_route(sample):
    config = load(sample)
    assert config.policy == "accelerator" and config.cpu is None
    assert config.accelerator.urls == ["http://127.0.0.1:8080"]
    assert config.accelerator.models_path == "/models"
    assert config.accelerator.api_prefix == "/v1"  # /v1/chat/completions, /v1/completions
    assert config.accelerator.health_path is None
    assert config.accelerator.metrics_path is None


def test_accelerator_concurrency_is_the_engines_max_num_seqs():
    assert load("ksana-ascend").accelerator.max_concurrency == 64
    assert load("gaudi-qwen2-72b").accelerator.max_concurrency == 128
    assert load("ksana-nvidia").accelerator.max_concurrency == 256  # unset: the default


def test_gaudi_script_serves_the_model_under_its_weights_path():
    config = load("gaudi-qwen2-72b")
    assert config.model == "Qwen2-72B-Instruct"
    assert config.accelerator.served_model_name == "/models/Qwen2-72B-Instruct"


GOOD = """
model: m
policy: split
accelerator: {urls: ["http://127.0.0.1:8001"]}
cpu: {urls: ["http://m-decode.ns.svc:8002"], discovery: dns}
"""


def test_the_good_example_loads():
    assert parse_config(GOOD).cpu.discovery == "dns"


@pytest.mark.parametrize(("text", "named"), [
    ("model: [unclosed", "not valid YAML"),
    ("- a list", "a YAML mapping"),
    (GOOD.replace("policy: split", "policy: split\nkvThreshold: 0.5"), "kvThreshold"),
    (GOOD.replace("discovery: dns", "discovery: mdns"), "cpu.discovery"),
    (GOOD.replace("http://127.0.0.1:8001", "127.0.0.1:8001"), "accelerator.urls"),
    ("model: m\npolicy: split\naccelerator: {urls: ['http://127.0.0.1:8001']}\n", "cpu tier"),
])
def test_bad_configs_are_config_errors_naming_the_problem(text, named):
    with pytest.raises(ConfigError, match=named) as error:
        parse_config(text, "router.yaml")
    assert str(error.value).startswith("router.yaml: ")


@settings(max_examples=300, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9]{0,19}", fullmatch=True), children,
                      max_size=4),
    max_leaves=12))
def test_libyaml_writes_what_the_python_emitter_writes(document):
    """The router ConfigMap is written with libyaml's CSafeDumper (speed); its text must be the
    pure-Python SafeDumper's, byte for byte, or an operator built without libyaml would roll
    every router after an upgrade (the ConfigMap's hash is in the pod template). Keys are the
    config's field names (identifiers); values any printable ASCII text, long ones included.
    (Beyond ASCII the two differ where an escaped string is longer than a line: the Python
    emitter folds it, libyaml does not. A long non-ASCII model name would be written differently
    by an operator without libyaml, and its routers would roll once; both emitters read back the
    same value.)"""
    fast = yaml.dump({"doc": document}, Dumper=SAFE_DUMPER, sort_keys=True)
    assert fast == yaml.safe_dump({"doc": document}, sort_keys=True)
