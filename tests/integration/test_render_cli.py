"""`heteroserve render` against the operator on the test control plane: the dry run's children
are what the operator applies for the same spec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from heteroserve_operator.reconcile import is_subset
from heteroserve_operator.render.meta import SPEC_HASH
from tests.cluster.catalogue import CATALOGUE
from tests.integration.conftest import SAMPLES, get_json, wait_ready

pytestmark = pytest.mark.integration


def dry_run(*args: str, kubeconfig=None) -> list[dict]:
    """The command as users run it; its JSON output's items."""
    env = {**os.environ, **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {})}
    result = subprocess.run([sys.executable, "-m", "heteroserve_local", "render", *args,
                             "-o", "json"], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["items"]


def apply_sample(cluster, namespace: str, sample: str) -> str:
    path = SAMPLES / f"{sample}.yaml"
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    wait_ready(cluster, namespace, name)
    return name


def remove(cluster, namespace: str, name: str) -> None:
    """Frees the sample's cards and cores for the next test."""
    cluster.kubectl("delete", "inferencedeployment", name, "-n", namespace, "--wait=true")
    cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", namespace, "--timeout=60s")


def by_name(items: list[dict]) -> dict[str, dict]:
    return {c["name"]: c for c in items}


def check_same_pod_template(rendered: dict, live: dict) -> None:
    """The fields the operator sets on each container and the pod's volumes: command and args
    exactly; env, resources, mounts and volumes as the operator's own drift check sees them
    (the same names, in the same order, every rendered value present, quantities by value: the
    apiserver adds defaults such as a fieldRef's apiVersion or a secret's defaultMode)."""
    want, got = rendered["spec"]["template"]["spec"], live["spec"]["template"]["spec"]
    assert [c["name"] for c in want["containers"]] == [c["name"] for c in got["containers"]]
    for container in want["containers"]:
        other = by_name(got["containers"])[container["name"]]
        where = f"{rendered['metadata']['name']}/{container['name']}"
        assert container.get("command") == other.get("command"), where
        assert container.get("args") == other.get("args"), where
        assert [e["name"] for e in container.get("env", [])] == [
            e["name"] for e in other.get("env", [])], where
        assert is_subset(container.get("env", []), other.get("env", [])), where
        for kind in ("limits", "requests"):
            assert set(container["resources"].get(kind, {})) <= set(
                other["resources"].get(kind, {})), where
        assert is_subset(container["resources"], other["resources"]), where
        assert is_subset(container.get("volumeMounts", []), other.get("volumeMounts", [])), where
    assert [v["name"] for v in want.get("volumes", [])] == [
        v["name"] for v in got.get("volumes", [])]
    assert is_subset(want.get("volumes", []), got.get("volumes", []))
    assert want.get("nodeSelector") == got.get("nodeSelector")


@pytest.mark.parametrize("sample", ["builtin-gpu-prefill-cpu-decode", "sysinfer-baichuan2-13b",
                                    "syshax-ds-32b-q4"])
def test_dry_run_deployments_equal_the_live_ones(cluster, operator, namespace, sample):
    name = apply_sample(cluster, namespace, sample)
    rendered = [c for c in dry_run("-f", str(SAMPLES / f"{sample}.yaml"), "--nodes",
                                   str(CATALOGUE), "-n", namespace)
                if c["kind"] == "Deployment"]
    live = get_json(cluster, "deployments", "-n", namespace, "-l",
                    f"app.kubernetes.io/instance={name}")["items"]
    assert sorted(d["metadata"]["name"] for d in rendered) == sorted(
        d["metadata"]["name"] for d in live)
    assert rendered
    live_by_name = {d["metadata"]["name"]: d for d in live}
    for deployment in rendered:
        current = live_by_name[deployment["metadata"]["name"]]
        assert deployment["spec"]["replicas"] == current["spec"]["replicas"]
        check_same_pod_template(deployment, current)
    remove(cluster, namespace, name)


def test_from_cluster_renders_exactly_what_is_live(cluster, operator, namespace):
    """With --from-cluster the facts are the operator's (the live Nodes and
    NodeResourceTopologies) and the uid is the object's: every child, spec hash included, is
    the live one, and the KV token Secret the operator created is the one shown."""
    sample = "builtin-gpu-prefill-cpu-decode"
    name = apply_sample(cluster, namespace, sample)
    children = dry_run("-f", str(SAMPLES / f"{sample}.yaml"), "-n", namespace,
                       "--from-cluster", kubeconfig=cluster.kubeconfig)
    kinds = {c["kind"] for c in children}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Secret"} <= kinds
    for child in children:
        resource = child["kind"].lower()
        live = get_json(cluster, resource, child["metadata"]["name"], "-n", namespace)
        assert live["metadata"]["ownerReferences"] == child["metadata"]["ownerReferences"]
        if child["kind"] == "Secret":
            assert "stringData" not in child and "data" not in child
            continue
        assert live["metadata"]["annotations"][SPEC_HASH] == \
            child["metadata"]["annotations"][SPEC_HASH], child["metadata"]["name"]
    remove(cluster, namespace, name)


def test_a_plan_the_cluster_cannot_hold_is_refused_before_applying(cluster, tmp_path):
    """The dry run says what the operator would put in status (NumaPlanFailed), exit 2."""
    document = yaml.safe_load((SAMPLES / "sysinfer-baichuan2-13b.yaml").read_text())
    document["spec"]["decode"]["cpus"] = 1000
    path = tmp_path / "too-big.yaml"
    path.write_text(yaml.safe_dump(document))
    result = subprocess.run([sys.executable, "-m", "heteroserve_local", "render", "-f",
                             str(path), "--from-cluster"], capture_output=True, text=True,
                            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
                            timeout=120, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "the plan does not fit" in result.stderr and "1000 CPUs" in result.stderr
