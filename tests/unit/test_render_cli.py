"""`heteroserve render`: the dry run prints what the operator applies, and refuses bad input with
a clear error and exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from heteroserve_local.__main__ import main
from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.reconcile import cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import SPEC_HASH, Owner
from tests.cluster.catalogue import CATALOGUE, load_catalogue

REPO = Path(__file__).resolve().parents[2]
SAMPLES = sorted((REPO / "crds" / "samples").glob("*.yaml"))
KV_HANDOFF_SAMPLES = {"builtin-gpu-prefill-cpu-decode", "builtin-gpu-prefill-cpu-decode-same-node"}


def operator_children(sample: Path, namespace: str = "default", uid: str = "") -> list[dict]:
    """What the operator applies for the sample on the test cluster: its render on the facts it
    reads there (the harness's Node and NodeResourceTopology objects for nodes.yaml)."""
    document = yaml.safe_load(sample.read_text())
    catalogue = load_catalogue()
    facts = cluster_facts([n.node_manifest() for n in catalogue],
                          [n.topology_manifest() for n in catalogue])
    owner = Owner(document["metadata"]["name"], namespace, uid)
    return render(InferenceDeploymentSpec.model_validate(document["spec"]), owner, facts
                  ).children


def run_render(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["render", *args])
    out, err = capsys.readouterr()
    return code, out, err


def rendered(capsys, *args: str) -> list[dict]:
    code, out, err = run_render(capsys, *args)
    assert code == 0, err
    return [d for d in yaml.safe_load_all(out) if d is not None]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_renders_what_the_operator_applies(capsys, sample):
    children = rendered(capsys, "-f", str(sample), "--nodes", str(CATALOGUE))
    secrets = [c for c in children if c["kind"] == "Secret"]
    applied = [c for c in children if c["kind"] != "Secret"]
    assert applied == operator_children(sample)
    assert any(c["kind"] == "Deployment" for c in applied)
    # The KV token Secret is shown for the pair that hands KV over, and never with a value.
    if sample.stem in KV_HANDOFF_SAMPLES:
        (secret,) = secrets
        name = yaml.safe_load(sample.read_text())["metadata"]["name"]
        assert secret["metadata"]["name"] == f"{name}-kv-token"
        assert "stringData" not in secret and "data" not in secret
    else:
        assert secrets == []


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_node_objects_give_the_same_render_as_the_catalogue(capsys, tmp_path, sample):
    """Node and NodeResourceTopology objects (a kind: List, as kubectl prints them) plan like
    the catalogue shape; the namespace and uid reach the children."""
    catalogue = load_catalogue()
    objects = tmp_path / "objects.yaml"
    objects.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        *[n.node_manifest() for n in catalogue], *[n.topology_manifest() for n in catalogue]]}))
    children = rendered(capsys, "-f", str(sample), "--nodes", str(objects), "-n", "prod",
                        "--uid", "uid-7")
    assert [c for c in children if c["kind"] != "Secret"] == operator_children(
        sample, "prod", "uid-7")


def test_the_catalogue_gives_the_facts_the_operator_reads_on_the_test_cluster():
    """Each catalogue machine becomes the facts the operator builds from the harness's Node and
    NodeResourceTopology objects: topology (SMT included), allocatable, labels (less the
    harness's kwok marker)."""
    from heteroserve_local.render_cli import facts_from_objects, load_node_objects

    catalogue = load_catalogue()
    cluster = cluster_facts([n.node_manifest() for n in catalogue],
                            [n.topology_manifest() for n in catalogue])
    mine = facts_from_objects("nodes.yaml", *load_node_objects(str(CATALOGUE)))
    assert [n.name for n in mine.nodes] == [n.name for n in cluster.nodes]
    for ours, theirs in zip(mine.nodes, cluster.nodes, strict=True):
        assert ours.topology == theirs.topology
        assert ours.allocatable == theirs.allocatable
        assert ours.labels == {k: v for k, v in theirs.labels.items() if k != "type"}
    assert any(n.topology.threads_per_core == 2 for n in mine.nodes)


def test_json_output_is_a_list_of_the_same_children(capsys):
    sample = REPO / "crds" / "samples" / "builtin-gpu-prefill-cpu-decode.yaml"
    as_yaml = rendered(capsys, "-f", str(sample), "--nodes", str(CATALOGUE))
    code, out, _ = run_render(capsys, "-f", str(sample), "--nodes", str(CATALOGUE), "-o", "json")
    assert code == 0
    document = json.loads(out)
    assert document["kind"] == "List" and document["items"] == as_yaml
    assert all(SPEC_HASH in c["metadata"].get("annotations", {}) for c in document["items"]
               if c["kind"] != "Secret")


def test_the_summary_names_the_plan(capsys):
    sample = REPO / "crds" / "samples" / "sysinfer-baichuan2-13b.yaml"
    code, out, _ = run_render(capsys, "-f", str(sample), "--nodes", str(CATALOGUE))
    assert code == 0
    assert ("# decode: 88 threads on CPUs 0-21,32-53,64-85,96-117 of NUMA node(s) 0,1,2,3; "
            "plan holds on kunpeng-cpu-0") in out.splitlines()


def test_without_node_facts_it_plans_like_the_operator_on_unpublished_nodes(capsys):
    sample = REPO / "crds" / "samples" / "builtin-smollm2-cpu.yaml"
    document = yaml.safe_load(sample.read_text())
    from heteroserve_operator.render.facts import ClusterFacts

    expected = render(InferenceDeploymentSpec.model_validate(document["spec"]),
                      Owner(document["metadata"]["name"], "default", ""), ClusterFacts()).children
    assert rendered(capsys, "-f", str(sample)) == expected


def test_the_file_namespace_is_used_unless_n_says_otherwise(capsys, tmp_path):
    document = yaml.safe_load((REPO / "crds/samples/builtin-smollm2-cpu.yaml").read_text())
    document["metadata"]["namespace"] = "team-a"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    assert {c["metadata"]["namespace"] for c in rendered(capsys, "-f", str(path))} == {"team-a"}
    assert {c["metadata"]["namespace"]
            for c in rendered(capsys, "-f", str(path), "-n", "b")} == {"b"}


# -- errors -----------------------------------------------------------------------------------
def spec_file(tmp_path: Path, spec: dict | None = None, name: str = "m", **top) -> Path:
    document = {"apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment",
                "metadata": {"name": name},
                "spec": spec if spec is not None else {
                    "model": {"name": "m", "path": "/models/m"}, "decode": {"cpus": 4}},
                **top}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def refused(capsys, *args: str) -> str:
    code, out, err = run_render(capsys, *args)
    assert code == 2, (out, err)
    assert out == "" and "Traceback" not in err
    assert err.startswith("heteroserve render: error: ")
    return err


def test_a_cel_rule_is_checked_as_the_apiserver_would(capsys, tmp_path):
    path = spec_file(tmp_path, {"model": {"name": "m", "path": "/models/m"},
                                "decode": {"cpus": 4, "placement": "sameNode"}})
    assert "sameNode uses the host cores of the prefill nodes" in refused(capsys, "-f", str(path))


def test_the_operators_variables_cannot_be_overridden(capsys, tmp_path):
    path = spec_file(tmp_path, {"model": {"name": "m", "path": "/models/m"},
                                "decode": {"cpus": 4, "engine": {"env": [
                                    {"name": "OMP_NUM_THREADS", "value": "64"}]}}})
    err = refused(capsys, "-f", str(path))
    assert "decode.engine.env may not set OMP_NUM_THREADS" in err


def test_schema_errors_name_the_field(capsys, tmp_path):
    path = spec_file(tmp_path, {"model": {"name": "m", "path": "models/m"},
                                "decode": {"cpus": 4, "cpuz": 1}})
    err = refused(capsys, "-f", str(path))
    assert "spec.decode.cpuz" in err
    assert "spec.model.path" in err


@pytest.mark.parametrize("name", ["with.dots", "a" * 60, "Upper"])
def test_names_the_children_cannot_carry_are_refused(capsys, tmp_path, name):
    assert "metadata.name" in refused(capsys, "-f", str(spec_file(tmp_path, name=name)))


def test_not_an_inference_deployment(capsys, tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment",
                                    "metadata": {"name": "x"}, "spec": {}}))
    assert "kind 'Deployment'" in refused(capsys, "-f", str(path))
    path.write_text("a: [unclosed\n")
    assert "cannot read" in refused(capsys, "-f", str(path))
    assert "cannot read" in refused(capsys, "-f", str(tmp_path / "missing.yaml"))
    path.write_text("---\na: 1\n---\nb: 2\n")
    assert "found 2" in refused(capsys, "-f", str(path))


def test_a_plan_that_does_not_fit(capsys, tmp_path):
    path = spec_file(tmp_path, {"model": {"name": "m", "path": "/models/m"},
                                "decode": {"cpus": 400}})
    err = refused(capsys, "-f", str(path), "--nodes", str(CATALOGUE))
    assert "does not fit" in err and "400 CPUs" in err


@pytest.mark.parametrize(("content", "message"), [
    ("just a string\n", "expected a catalogue"),
    ("nodes: []\n", "non-empty list"),
    (yaml.safe_dump({"nodes": [{"name": "n", "numa": [{"cpus": "0-3"}], "gpus": 1}]}),
     "unknown keys ['gpus']"),
    (yaml.safe_dump({"nodes": [{"name": "n", "numa": [{"cpus": "0-x"}]}]}), "numa[0].cpus"),
    (yaml.safe_dump({"nodes": [{"name": "n", "numa": [{"cpus": "0-3"}],
                                "capacity": {"cpu": "8"}}]}), "capacity.cpu is 8"),
    (yaml.safe_dump({"nodes": [{"name": "n"}]}), "numa must be a non-empty list"),
    (yaml.safe_dump({"nodes": [{"name": "n", "numa": [{"cpus": "0-3"}]},
                               {"name": "n", "numa": [{"cpus": "0-3"}]}]}), "duplicate"),
    (yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
     "is not a named Node"),
    (yaml.safe_dump({"apiVersion": "topology.node.k8s.io/v1alpha2",
                     "kind": "NodeResourceTopology", "metadata": {"name": "n"}, "zones": []}),
     "no Node objects"),
    (yaml.safe_dump([{"kind": "Node", "metadata": {"name": "n"}},
                     {"kind": "NodeResourceTopology", "metadata": {"name": "n"},
                      "zones": [{"type": "Node"}]}]), "malformed"),
])
def test_node_files_of_unknown_shape(capsys, tmp_path, content, message):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(content)
    assert message in refused(capsys, "-f", str(spec_file(tmp_path)), "--nodes", str(nodes))


def test_from_cluster_without_a_kubeconfig(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert "--from-cluster" in refused(capsys, "-f", str(spec_file(tmp_path)),
                                       "--from-cluster")


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    path = spec_file(tmp_path, name="bad.name")
    result = subprocess.run([sys.executable, "-m", "heteroserve_local", "render", "-f",
                             str(path)], check=False, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "metadata.name 'bad.name'" in result.stderr


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`heteroserve render ... | head -1`: the closed pipe ends the command quietly."""
    sample = REPO / "crds" / "samples" / "syshax-ds-32b.yaml"
    proc = subprocess.Popen([sys.executable, "-m", "heteroserve_local", "render", "-f",
                             str(sample), "--nodes", str(CATALOGUE)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0)
    proc.stdout.close()  # before it writes: its first write meets a closed pipe
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err and proc.returncode == 1, err
