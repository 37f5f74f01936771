"""Generates the InferenceDeployment CRD, the chart's copy and the API reference from the models.

`python -m heteroserve_operator.api.crd` rewrites the generated files; `--check` exits 1 when one
of them differs from what the models produce (CI runs the drift test, tests/unit/test_crd.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from .models import (
    GROUP,
    KIND,
    NAME_RULES,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ApiModel,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
)

REPO = Path(__file__).resolve().parents[3]
CRD_NAME = f"{PLURAL}.{GROUP}"
GENERATED_HEADER = (
    "# Generated from heteroserve_operator/api/models.py by "
    "`python -m heteroserve_operator.api.crd`; do not edit.\n"
)
PRINTER_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Prefill",
        "type": "integer",
        "jsonPath": ".status.prefill.readyReplicas",
        "description": "Ready prefill pods",
    },
    {
        "name": "Decode",
        "type": "integer",
        "jsonPath": ".status.decode.readyReplicas",
        "description": "Ready decode pods",
    },
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """pydantic's JSON Schema -> a Kubernetes structural OpenAPI v3 schema."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        # A field's own description wins over the model's docstring.
        target.update({k: v for k, v in node.items() if k in ("description", "default")})
        node = target
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        if len(branches) == 1:
            merged = dict(branches[0])
            merged.update({k: v for k, v in node.items() if k != "anyOf"})
            node = _structural(merged, defs)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if node.get("default", ...) is None:
        del node["default"]
    node.pop("title", None)
    if "description" in node:
        node["description"] = " ".join(node["description"].split())
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "enum" in node and "type" not in node:
        kinds = {type(v) for v in node["enum"]}
        node["type"] = "integer" if kinds == {int} else "string"
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    return out


def openapi_schema(model: type[ApiModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    return _structural(schema, defs)


def status_schema() -> dict[str, Any]:
    schema = openapi_schema(InferenceDeploymentStatus)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["required"] = ["type", "status"]
    return schema


def crd() -> dict[str, Any]:
    spec_schema = openapi_schema(InferenceDeploymentSpec)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "heteroserve"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "categories": ["heteroserve"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": " ".join(InferenceDeploymentSpec.__doc__.split()),
                            "required": ["spec"],
                            "x-kubernetes-validations": NAME_RULES,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    return GENERATED_HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


def code(value: Any) -> str:
    """A Markdown code span of a value as written in YAML or JSON: strings bare (an empty or blank
    one quoted), everything else as compact JSON (`{}`, `8192`, `true`); backticks inside get a
    longer fence."""
    text = value if isinstance(value, str) and value.strip() else json.dumps(
        value, separators=(", ", ": "))
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def prose(text: str, table: bool = False) -> str:
    """Text for Markdown: `<` and `>` outside code spans as entities (`<name>` is no HTML tag),
    and in a table cell every `|` escaped."""
    parts = " ".join(text.split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    text = "`".join(parts)
    return text.replace("|", "\\|") if table else text


def reference_markdown() -> str:
    """docs/reference/api.md: every field, its type, default and description; the CEL rules."""
    lines = [
        "<!-- " + GENERATED_HEADER.strip("# \n") + " -->",
        f"# API reference: {KIND} ({GROUP}/{VERSION})",
        "",
        f"Short name `{SHORT_NAMES[0]}`. Every field below is also `kubectl explain "
        f"{PLURAL}.spec.<field>` text.",
        "",
    ]

    def rule_lines(rules: list[dict[str, str]], where: str) -> None:
        lines.append(f"Rules checked by the apiserver on `{where}`:")
        lines.extend(f"- {code(r['rule'])} — {prose(r['message'])}" for r in rules)
        lines.append("")

    def walk(schema: dict[str, Any], path: str, depth: int) -> None:
        rules = schema.get("x-kubernetes-validations", [])
        if rules:
            rule_lines(rules, path or "spec")
        props = schema.get("properties", {})
        if not props:
            return
        required = set(schema.get("required", []))
        lines.extend(["| field | type | default | description |", "|---|---|---|---|"])
        nested, field_rules = [], []
        for name, prop in props.items():
            field = f"{path}.{name}".lstrip(".")
            kind = prop.get("type", "object")
            if "enum" in prop:
                kind = " \\| ".join(code(v) for v in prop["enum"])
            elif kind == "array":
                kind = f"array of {prop.get('items', {}).get('type', 'object')}"
            if name in required:
                default = "required"
            elif "default" in prop:
                default = code(prop["default"])
            else:
                default = ""
            desc = prose(prop.get("description", ""), table=True)
            lines.append(f"| {code(field)} | {kind} | {default} | {desc} |")
            if prop.get("x-kubernetes-validations") and not prop.get("properties"):
                field_rules.append((field, prop["x-kubernetes-validations"]))
            child = prop.get("items", prop) if prop.get("type") == "array" else prop
            if child.get("properties"):
                nested.append((child, field))
        lines.append("")
        for field, rules in field_rules:
            rule_lines(rules, field)
        for child, child_path in nested:
            lines.extend([f"{'#' * min(depth + 1, 6)} `{child_path}`", ""])
            if child.get("description"):
                lines.extend([prose(child["description"]), ""])
            walk(child, child_path, depth + 1)

    lines.extend(["## metadata", ""])
    rule_lines(NAME_RULES, "metadata.name")
    lines.extend(["## spec", ""])
    walk(openapi_schema(InferenceDeploymentSpec), "", 2)
    lines.extend(["## status", ""])
    walk(status_schema(), "", 2)
    return "\n".join(lines).rstrip() + "\n"


def generated_files() -> dict[Path, str]:
    text = crd_yaml()
    return {
        REPO / "crds" / f"{GROUP}_{PLURAL}.yaml": text,
        REPO / "charts" / "heteroserve" / "crds" / f"{GROUP}_{PLURAL}.yaml": text,
        REPO / "docs" / "reference" / "api.md": reference_markdown(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when a file has drifted")
    args = parser.parse_args(argv)
    drifted = []
    for path, text in generated_files().items():
        current = path.read_text() if path.exists() else None
        if current != text:
            drifted.append(path.relative_to(REPO))
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check and drifted:
        print(
            "generated files differ from the models; run `python -m "
            f"heteroserve_operator.api.crd`: {', '.join(map(str, drifted))}",
            file=sys.stderr,
        )
        return 1
    for path in drifted:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
