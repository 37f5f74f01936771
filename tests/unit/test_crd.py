"""The CRD, the chart's copy and the API reference are generated from the models, never edited."""

from __future__ import annotations

import re

import pytest
import yaml
from pydantic import ValidationError

from heteroserve_operator.api import crd
from heteroserve_operator.api.models import (
    CHILD_NAME_SUFFIXES,
    DNS_LABEL_MAX,
    MAX_NAME_LENGTH,
    NAME_RULES,
    InferenceDeploymentSpec,
    name_rule_failures,
)
from heteroserve_operator.render.children import possible_children
from heteroserve_operator.render.kv_token import secret_name
from heteroserve_operator.render.meta import Owner
from tests.fixtures.invalid_specs import (
    ALL_VALID_SPECS,
    BASE,
    INVALID_NAMES,
    INVALID_SPECS,
    LONGEST_NAME,
    PASSING_SPECS,
    VALID_NAMES,
    VALID_SPECS,
)


def schema_rules(node) -> list[dict[str, str]]:
    """Every x-kubernetes-validations entry in a schema, at any depth."""
    found = []
    if isinstance(node, dict):
        found.extend(node.get("x-kubernetes-validations", []))
        for key, value in node.items():
            if key != "x-kubernetes-validations":
                found.extend(schema_rules(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(schema_rules(item))
    return found


def crd_schema() -> dict:
    return crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


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
    schema = crd_schema()
    spec_messages = {rule["message"] for rule in schema_rules(schema["properties"]["spec"])}
    assert spec_messages == {message for _name, _spec, message in INVALID_SPECS}
    name_messages = {rule["message"] for rule in schema["x-kubernetes-validations"]}
    assert name_messages == {message for _name, message in INVALID_NAMES}
    # Field-level rules are found too, not only the models' own.
    assert "model.path must be an absolute path (starting with /)" in spec_messages


def test_every_rule_has_a_passing_fixture():
    schema = crd_schema()
    spec_messages = {rule["message"] for rule in schema_rules(schema["properties"]["spec"])}
    assert spec_messages == {message for _name, _spec, message in PASSING_SPECS}
    name_messages = {rule["message"] for rule in schema["x-kubernetes-validations"]}
    assert name_messages == {message for _name, message in VALID_NAMES}
    assert len({name for name, _spec, _message in PASSING_SPECS}) == len(PASSING_SPECS)


def _distance(one, other) -> int:
    """How many subtrees differ: a key present in only one spec counts once, whatever it holds."""
    if isinstance(one, dict) and isinstance(other, dict):
        return sum(_distance(one[key], other[key]) if key in one and key in other else 1
                   for key in one.keys() | other.keys())
    return int(one != other)


def test_every_rule_has_a_passing_fixture_near_its_failing_one():
    """A passing fixture proves the rule lets through what it should only when it is near what
    the rule refuses (BASE passes every rule, and proves nothing about the rules it skips): for
    every rule, one passing fixture within three changes of one of its failing fixtures."""
    nearest = {}
    for name, spec, message in PASSING_SPECS:
        distance = min(_distance(spec, failing) for _n, failing, m in INVALID_SPECS
                       if m == message)
        assert distance > 0, name
        nearest[message] = min(nearest.get(message, distance), distance)
    assert {m: d for m, d in nearest.items() if d > 3} == {}
    # The name rule's edge: the longest name it admits, one character short of a refused one.
    assert (LONGEST_NAME, NAME_RULES[0]["message"]) in VALID_NAMES
    assert (LONGEST_NAME + "x", NAME_RULES[0]["message"]) in INVALID_NAMES


def _ids(fixtures) -> list[str]:
    return [fixture[0] for fixture in fixtures]


@pytest.mark.parametrize(("name", "spec"), ALL_VALID_SPECS.items(), ids=list(ALL_VALID_SPECS))
def test_valid_fixtures_pass_the_python_mirror(name, spec):
    InferenceDeploymentSpec.model_validate(spec)


def test_every_valid_spec_is_tested():
    assert {n for n, _s in VALID_SPECS} | {n for n, _s, _m in PASSING_SPECS} | {"base"} == \
        set(ALL_VALID_SPECS)


@pytest.mark.parametrize(("name", "message"), INVALID_NAMES, ids=[n for n, _m in INVALID_NAMES])
def test_python_mirror_of_the_name_rules(name, message):
    assert [rule["message"] for rule in name_rule_failures(name)] == [message]


@pytest.mark.parametrize(("name", "message"), VALID_NAMES, ids=_ids(VALID_NAMES))
def test_python_mirror_accepts_the_valid_names(name, message):
    assert name_rule_failures(name) == []


def test_the_longest_accepted_name_leaves_every_child_a_dns_label():
    assert name_rule_failures(LONGEST_NAME) == []
    names = [name for _api, _kind, name in possible_children(LONGEST_NAME)]
    names.append(secret_name(Owner(LONGEST_NAME, "ns", "uid")))
    assert max(map(len, names)) == DNS_LABEL_MAX
    assert all(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names), names
    # Every suffix the render uses is one the limit was computed from.
    suffixes = {n[len(LONGEST_NAME):] for n in names} - {""}
    assert suffixes <= set(CHILD_NAME_SUFFIXES)
    assert DNS_LABEL_MAX - max(map(len, suffixes)) == MAX_NAME_LENGTH


def test_reference_renders_cleanly():
    """No stray backticks, YAML document ends or bare <tags> in the generated Markdown."""
    text = crd.reference_markdown()
    assert "\n..." not in text and "``" not in text
    for line in text.splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            assert len(cells) == 4, line
            for cell in cells:
                assert cell.count("`") % 2 == 0, line
        else:
            assert line.count("`") % 2 == 0, line
        outside_code = "".join(line.split("`")[::2])
        assert "<" not in outside_code or line.startswith("<!--"), line
    assert "| `model.maxModelLen` | integer | `8192` |" in text
    assert "| `model.dtype` | `auto` \\| `half`" in text
    assert "| `router` | object | `{}` |" in text
    assert "| `decode.engine.env.value` | string | `\"\"` |" in text


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
