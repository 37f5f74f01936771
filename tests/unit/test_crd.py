"""The CRD, the chart's copy and the API reference are generated from the models, never edited."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from heteroserve_operator.api import crd
from heteroserve_operator.api.models import (
    AcceleratorSpec,
    ApiModel,
    DecodeSpec,
    InferenceDeploymentSpec,
    ModelVolume,
    PrefillSpec,
    TokenRange,
)
from tests.fixtures.invalid_specs import BASE, INVALID_SPECS

RULE_MODELS: list[type[ApiModel]] = [ModelVolume, AcceleratorSpec, TokenRange, PrefillSpec,
                                     DecodeSpec, InferenceDeploymentSpec]


def test_generated_files_have_not_drifted():
    assert crd.main(["--check"]) == 0, "run: python -m heteroserve_operator.api.crd"


def test_drift_is_detected(tmp_path, monkeypatch):
    generated = crd.generated_files()
    path = next(iter(generated))
    fake = tmp_path / path.name
    fake.write_text(generated[path].replace("heteroserve", "other", 1))
    monkeypatch.setattr(crd, "generated_files", lambda: {fake: generated[path]})
    monkeypatch.setattr(crd, "REPO", tmp_path)
    assert crd.main(["--check"]) == 1


def test_schema_is_structural():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

    def walk(node, path):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        if node.get("type") == "object" or "properties" in node:
            assert node.get("type") == "object", path
            assert node.get("additionalProperties") is not False, path
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "")
    spec = schema["properties"]["spec"]["properties"]
    assert spec["decode"]["properties"]["quantization"]["enum"] == ["q8_0", "q4_0"]
    assert spec["decode"]["properties"]["gemvTiling"] == {
        "description": spec["decode"]["properties"]["gemvTiling"]["description"],
        "enum": [2, 4], "type": "integer"}
    assert spec["router"]["default"] == {}
    assert all(p.get("description") for p in spec.values())


def test_every_rule_has_an_invalid_fixture():
    messages = {rule["message"] for model in RULE_MODELS for rule in model.cel_rules()}
    covered = {message for _name, _spec, message in INVALID_SPECS}
    assert messages == covered


@pytest.mark.parametrize(("name", "spec", "message"), INVALID_SPECS,
                         ids=[n for n, _s, _m in INVALID_SPECS])
def test_python_mirror_of_each_rule(name, spec, message):
    """Local mode has no apiserver: the same rules refuse the spec in Python."""
    with pytest.raises(ValidationError) as error:
        InferenceDeploymentSpec.model_validate(spec)
    assert message in str(error.value)


def test_base_fixture_and_samples_are_valid():
    InferenceDeploymentSpec.model_validate(BASE)
    for path in sorted((crd.REPO / "crds" / "samples").glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        InferenceDeploymentSpec.model_validate(document["spec"])


def test_reference_docs_list_every_spec_field():
    text = crd.reference_markdown()
    for field in ("`model.maxModelLen`", "`decode.gemvTiling`", "`prefill.engine.warmup`",
                  "`router.offload.kvCacheUsageThreshold`", "`numaPlans`"):
        assert field in text
