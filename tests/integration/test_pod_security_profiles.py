"""The real apiserver's Pod Security admission judges every engine profile's pods as
docs/security.md says: admitted at the level the profile needs and every looser one, refused at
every stricter one; and each seed sample as rendered (docs/seeds.md, "What a real cluster needs").

Pods, not Deployments: Pod Security enforcement judges Pods (a Deployment's refused pod shows only
as a ReplicaSet event), so each rendered pod template is offered as a bare Pod with a server-side
dry run (`kubectl create --dry-run=server`: admission runs, nothing is stored) into namespaces
labelled pod-security.kubernetes.io/enforce=restricted, baseline and privileged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.reconcile import cluster_facts, is_subset
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import Owner
from heteroserve_operator.render.security import LEVELS
from tests.cluster.catalogue import load_catalogue
from tests.conftest import temporary_namespace
from tests.engine_profiles import PROFILES

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])
# Each seed sample as rendered: the level its pods need (docs/seeds.md). The samples' models are
# hostPath volumes, so every seed's pods need "privileged"; only heteroserve's own samples, whose
# models ship in the image, run restricted.
SAMPLE_LEVELS = {
    "builtin-gpu-prefill-cpu-decode": "restricted",
    "builtin-gpu-prefill-cpu-decode-same-node": "restricted",
    "builtin-smollm2-cpu": "restricted",
    "gaudi-ds-r1-distill-llama-70b": "privileged",
    "gaudi-ds-r1-fp8": "privileged",
    "gaudi-qwen2-72b": "privileged",
    "ksana-ascend": "privileged",
    "ksana-nvidia": "privileged",
    "syshax-ds-32b": "privileged",
    "syshax-ds-32b-q4": "privileged",
    "sysinfer-baichuan2-13b": "privileged",
}
# What the refusals name: the reasons docs/security.md gives for each profile's level.
REFUSAL_REASONS = {
    ("vllm-cpu", "baseline"): 'seccompProfile (container "engine" must not set '
                              'securityContext.seccompProfile.type to "Unconfined")',
    ("vllm-gaudi", "baseline"): 'non-default capabilities (container "engine" must not include '
                                '"SYS_NICE" in securityContext.capabilities.add)',
    ("ksana-nvidia", "restricted"): 'runAsNonRoot != true (container "engine" must not set '
                                    'securityContext.runAsNonRoot=false)',
    ("ksana-ascend", "baseline"): "hostPath volumes",
}


@pytest.fixture(scope="module")
def enforced(cluster) -> Iterator[dict[str, str]]:
    """level -> a namespace that enforces it (dry runs store nothing: the tests share them)."""
    with (temporary_namespace(cluster) as restricted, temporary_namespace(cluster) as baseline,
          temporary_namespace(cluster) as privileged):
        namespaces = {"restricted": restricted, "baseline": baseline, "privileged": privileged}
        for level, name in namespaces.items():
            cluster.kubectl("label", "namespace", name,
                            f"pod-security.kubernetes.io/enforce={level}",
                            "pod-security.kubernetes.io/enforce-version=latest")
        # The ServiceAccount admission needs each namespace's default account.
        deadline = time.monotonic() + 60
        for name in namespaces.values():
            while cluster.kubectl("get", "serviceaccount", "default", "-n", name,
                                  check=False).returncode != 0:
                assert time.monotonic() < deadline, f"no default ServiceAccount in {name}"
                time.sleep(0.5)
        yield namespaces


def rendered_pods(spec: InferenceDeploymentSpec) -> dict[str, dict]:
    """Deployment suffix -> its pod template as a bare Pod."""
    pods = {}
    for child in render(spec, Owner("m", "ns", "uid-1"), FACTS).children:
        if child["kind"] == "Deployment":
            suffix = child["metadata"]["name"].removeprefix("m-")
            pods[suffix] = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": f"admission-{suffix}"},
                            "spec": child["spec"]["template"]["spec"]}
    return pods


def admission(cluster, namespace: str, pod: dict) -> str | None:
    """None when the apiserver admits the pod, else its refusal."""
    result = cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-o", "name",
                             "-f", "-", stdin=json.dumps(pod), check=False)
    return None if result.returncode == 0 else result.stderr


def check_levels(cluster, enforced: dict[str, str], pod: dict, needed: str) -> dict[str, str]:
    """Admitted at `needed` and looser, refused stricter; returns the refusals by level."""
    refusals = {}
    for level in LEVELS:
        refused = admission(cluster, enforced[level], pod)
        should_admit = LEVELS.index(level) >= LEVELS.index(needed)
        assert (refused is None) is should_admit, (pod["metadata"]["name"], level, refused)
        if refused is not None:
            assert "violates PodSecurity" in refused, refused
            refusals[level] = refused
    return refusals


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_each_engine_profiles_pods_are_admitted_exactly_from_the_level_it_needs(
        cluster, enforced, profile):
    spec, levels = PROFILES[profile]
    pods = rendered_pods(spec)
    assert set(pods) == set(levels)
    for suffix, pod in pods.items():
        refusals = check_levels(cluster, enforced, pod, levels[suffix])
        for level, refusal in refusals.items():
            reason = REFUSAL_REASONS.get((profile, level))
            if reason:
                assert reason in refusal, refusal


@pytest.mark.parametrize("sample", sorted(SAMPLE_LEVELS))
def test_each_sample_as_rendered_needs_the_level_the_seeds_page_states(cluster, enforced,
                                                                         sample):
    document = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    pods = rendered_pods(InferenceDeploymentSpec.model_validate(document["spec"]))
    for pod in pods.values():
        check_levels(cluster, enforced, pod, SAMPLE_LEVELS[sample])


def test_every_sample_has_a_level():
    assert {p.stem for p in SAMPLES.glob("*.yaml")} == set(SAMPLE_LEVELS)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_apiserver_keeps_every_field_each_profile_renders(cluster, enforced, profile):
    """The operator's drift check sees no drift after the apiserver's defaulting: the new
    fields (init containers, a container's own user and seccomp profile) come back as rendered,
    or a reconcile would apply the Deployment again and again."""
    spec, _levels = PROFILES[profile]
    for child in render(spec, Owner("m", "ns", "uid-1"), FACTS).children:
        if child["kind"] != "Deployment":
            continue
        # Into the test's namespace, without the owner (which exists nowhere).
        bare = {**child, "metadata": {"name": child["metadata"]["name"]}}
        result = cluster.kubectl("create", "--dry-run=server", "-n", enforced["privileged"],
                                 "-o", "json", "-f", "-", stdin=json.dumps(bare))
        assert is_subset(child["spec"], json.loads(result.stdout)["spec"]), profile
