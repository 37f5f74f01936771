"""The passing side of every CEL rule on the real apiserver: each valid fixture
(tests/fixtures/invalid_specs.py: VALID_SPECS, and PASSING_SPECS, the nearest valid variant of
every rule's failing fixture) and each valid name is accepted by a server-side dry run (`kubectl
apply --dry-run=server`: schema, defaults and CEL rules run, nothing is stored). The refusals are
tests/integration/test_operator_behaviour.py and test_control_plane.py. Where the rules are at
their edges (quantities, names), the apiserver and the Python mirror of the rules (local mode)
must give the same verdict."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.api.models import MAX_NAME_LENGTH, name_rule_failures
from tests.conftest import temporary_namespace
from tests.fixtures.invalid_specs import ALL_VALID_SPECS, BASE, VALID_NAMES, _with

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dry_run_namespace(cluster, crd_installed) -> Iterator[str]:
    """One namespace for the whole module: a dry run stores nothing, so the tests share it."""
    with temporary_namespace(cluster) as name:
        yield name


def dry_run(cluster, namespace: str, name: str, spec: dict) -> subprocess.CompletedProcess:
    document = {"apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    return cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                           stdin=json.dumps(document), check=False)


@pytest.mark.parametrize(("name", "spec"), ALL_VALID_SPECS.items(), ids=list(ALL_VALID_SPECS))
def test_the_apiserver_accepts_every_valid_spec(cluster, dry_run_namespace, name, spec):
    result = dry_run(cluster, dry_run_namespace, name, spec)
    assert result.returncode == 0, (name, result.stderr)
    # What the apiserver would store (its defaults filled in) is what the models make of it.
    answered = json.loads(result.stdout)
    assert InferenceDeploymentSpec.model_validate(answered["spec"]) == \
        InferenceDeploymentSpec.model_validate(spec)
    assert cluster.kubectl("get", "inferencedeployment", name, "-n", dry_run_namespace,
                           check=False).returncode != 0, "a dry run stored the object"


@pytest.mark.parametrize(("name", "message"), VALID_NAMES, ids=[n for n, _m in VALID_NAMES])
def test_the_apiserver_accepts_every_valid_name(cluster, dry_run_namespace, name, message):
    result = dry_run(cluster, dry_run_namespace, name, BASE)
    assert result.returncode == 0, (name, result.stderr)
    assert json.loads(result.stdout)["metadata"]["name"] == name


def _mirror_accepts(spec: dict) -> bool:
    try:
        InferenceDeploymentSpec.model_validate(spec)
    except ValidationError:
        return False
    return True


# Values at and beside the edges of the field rules: (field, value).
EDGES = [
    *(("decode.memory", v) for v in ("64Mi", "63Mi", "67108864", "67108863", "0.0625Gi",
                                     "65536Ki", "67109k", "67108k", "16Ti", "16384Gi",
                                     "16385Gi", "17592186044416", "17592186044417",
                                     "17.592186044416T", "17.6T", "0.015625Ti")),
    *(("prefill.engine.shmSize", v) for v in ("1Mi", "1048576", "1048575", "1024Ki", "1023Ki",
                                              "0.5Mi", "1.048576M", "1M")),
    *(("model.path", v) for v in ("/", "//m", " /m", "./m")),
    *(("decode.numaNodes", v) for v in (1, 2, 8, 16)),
    *(("decode.engine.env", v) for v in ([], [{"name": "omp_num_threads"}],
                                         [{"name": "NRC"}], [{"name": "NRC", "value": ""}])),
    *(("model.volume", v) for v in ({}, {"claimName": ""}, {"claimName": "c", "hostPath": None},
                                    {"mountPath": "/models"})),
    *(("prefill.accelerator", v) for v in ({"type": "gaudi", "moduleIds": []},
                                           {"type": "nvidia", "moduleIds": []})),
]


@pytest.mark.parametrize(("field", "value"), EDGES, ids=[f"{f}={json.dumps(v)}" for f, v in EDGES])
def test_the_apiserver_and_the_python_mirror_agree_at_the_edges(cluster, dry_run_namespace,
                                                                field, value):
    spec = _with(field, value)
    result = dry_run(cluster, dry_run_namespace, "edge", spec)
    assert (result.returncode == 0) == _mirror_accepts(spec), (field, value, result.stderr)


NAMES = ["a", "a1", "a-1", "a-", "-a", "1a", "a.b", "A", "a_b", "n" * MAX_NAME_LENGTH,
         "n" * (MAX_NAME_LENGTH + 1)]


@pytest.mark.parametrize("name", NAMES)
def test_the_apiserver_and_the_python_mirror_agree_on_names(cluster, dry_run_namespace, name):
    result = dry_run(cluster, dry_run_namespace, name, BASE)
    assert (result.returncode == 0) == (name_rule_failures(name) == []), (name, result.stderr)
