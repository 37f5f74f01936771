"""`heteroserve render`: the dry run. Prints the children the operator would apply for an
InferenceDeployment, rendered by the operator's own code (render/children.py) on node facts read
from a file or from a live cluster. Nothing is applied.

    heteroserve render -f spec.yaml [--nodes nodes.yaml | --from-cluster] [-n NS] [-o yaml|json]

Node facts, in one of two shapes (`--nodes`):

- a catalogue: a mapping with `nodes:`, a list of machines, each
  `{name, arch, labels, capacity, threadsPerCore, numa: [{cpus, memory, devices}]}` (the shape of
  tests/cluster/nodes.yaml); each becomes the Node and the NodeResourceTopology that the
  operator reads on a cluster with NFD's topology updater;
- Kubernetes objects: Node and NodeResourceTopology (topology.node.k8s.io/v1alpha2) objects, as a
  YAML stream, a YAML list or a `kind: List` (what `kubectl get nodes,noderesourcetopologies -o
  yaml` prints).

Either way the operator's `cluster_facts` turns them into the facts the render uses, so the dry run
and the operator plan on the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

RENDER_DOC = """Prints the children the operator would apply for an InferenceDeployment
(Deployments, Services, ConfigMaps, PodDisruptionBudgets, Ingress, and the KV token Secret without
its value), rendered by the operator's own code, after the same validation as the CRD's rules.
Node facts come from --nodes (a catalogue like tests/cluster/nodes.yaml, or Node and
NodeResourceTopology objects) or --from-cluster (the current kubeconfig context); with neither, the
decode CPUs are planned as the operator plans them when no node publishes its NUMA layout. Nothing
is applied. The children's ownerReferences carry the InferenceDeployment's uid, which exists only
once it is applied: empty unless --uid is given or --from-cluster finds the object."""

NODE_KEYS = {"name", "description", "arch", "labels", "capacity", "allocatable",
             "threadsPerCore", "topologyPolicy", "numa"}
ZONE_KEYS = {"cpus", "memory", "devices"}
NRT_API_VERSION = "topology.node.k8s.io/v1alpha2"
# The labels NFD and the kubelet put on a node, which the catalogue shape leaves implicit.
LABEL_ARCH = "kubernetes.io/arch"
LABEL_OS = "kubernetes.io/os"
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_MEMORY_NUMA = "feature.node.kubernetes.io/memory-numa"


class RenderError(ValueError):
    """Bad input: the spec, the node file, the cluster, or a plan that does not fit."""


def add_parser(commands: argparse._SubParsersAction) -> None:
    render = commands.add_parser("render", help="print the children the operator would apply "
                                 "for an InferenceDeployment (a dry run)", description=RENDER_DOC)
    render.add_argument("-f", "--file", required=True,
                        help="InferenceDeployment YAML ('-': standard input)")
    facts = render.add_mutually_exclusive_group()
    facts.add_argument("--nodes", metavar="FILE",
                       help="node facts: a catalogue (`nodes:` list, the shape of "
                            "tests/cluster/nodes.yaml) or Node and NodeResourceTopology objects")
    facts.add_argument("--from-cluster", action="store_true",
                       help="read Nodes and NodeResourceTopologies from the cluster of the "
                            "current kubeconfig context (read-only)")
    render.add_argument("--context", help="with --from-cluster: the kubeconfig context")
    render.add_argument("-n", "--namespace", default=None,
                        help="the namespace it would be applied in (default: the file's "
                             "metadata.namespace, else 'default')")
    render.add_argument("--uid", default=None,
                        help="the InferenceDeployment's uid for the children's ownerReferences")
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                        help="yaml: a stream of documents with a summary in comments; json: a "
                             "v1 List (default yaml)")


# -- the spec -----------------------------------------------------------------------------------
def load_document(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RenderError(f"cannot read {path}: {error}") from None
    if len(documents) != 1:
        raise RenderError(f"{path}: expected one InferenceDeployment document, found "
                          f"{len(documents)}")
    return documents[0]


def validate(path: str, document: Any):
    """(name, namespace or None, spec): the checks the apiserver makes at `kubectl apply` (the
    schema and the CRD's CEL rules, in their Python equivalents) and the name rules."""
    from pydantic import ValidationError

    from heteroserve_operator.api import GROUP, KIND, VERSION, InferenceDeploymentSpec
    from heteroserve_operator.api.models import name_rule_failures

    if not isinstance(document, dict):
        raise RenderError(f"{path}: expected an {KIND} document (apiVersion, kind, metadata, "
                          "spec)")
    kind, api_version = document.get("kind"), document.get("apiVersion")
    if kind != KIND:
        raise RenderError(f"{path}: kind {kind!r}, expected {KIND}")
    if api_version != f"{GROUP}/{VERSION}":
        raise RenderError(f"{path}: apiVersion {api_version!r}, expected {GROUP}/{VERSION}")
    metadata = document.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise RenderError(f"{path}: metadata.name is required")
    problems = [rule["message"] for rule in name_rule_failures(name)]
    if problems:
        raise RenderError(f"{path}: metadata.name {name!r}: " + "; ".join(problems))
    namespace = metadata.get("namespace")
    if not isinstance(document.get("spec"), dict):
        raise RenderError(f"{path}: spec is required")
    try:
        spec = InferenceDeploymentSpec.model_validate(document["spec"])
    except ValidationError as error:
        problems = [f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"]
                    else f"spec: {e['msg']}" for e in error.errors()]
        raise RenderError(f"{path}: invalid {KIND}:\n  " + "\n  ".join(problems)) from None
    return name, namespace, spec


# -- node facts ---------------------------------------------------------------------------------
def load_node_objects(path: str) -> tuple[list[dict], list[dict]]:
    """(Node objects, NodeResourceTopology objects) from a --nodes file of either shape."""
    try:
        documents = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RenderError(f"cannot read {path}: {error}") from None
    if len(documents) == 1 and isinstance(documents[0], dict) and "nodes" in documents[0]:
        entries = documents[0]["nodes"]
        if not isinstance(entries, list) or not entries:
            raise RenderError(f"{path}: `nodes` must be a non-empty list of machines")
        nodes = [catalogue_node(path, index, entry) for index, entry in enumerate(entries)]
        names = [n["metadata"]["name"] for n, _ in nodes]
        if len(set(names)) != len(names):
            raise RenderError(f"{path}: duplicate node names in {names}")
        return [n for n, _ in nodes], [t for _, t in nodes]
    objects = _flatten(documents)
    if not objects:
        raise RenderError(f"{path}: {SHAPES}")
    nodes, topologies = [], []
    for index, obj in enumerate(objects):
        kind = obj.get("kind") if isinstance(obj, dict) else None
        name = ((obj.get("metadata") or {}).get("name") if isinstance(obj, dict) else None)
        if kind not in ("Node", "NodeResourceTopology") or not isinstance(name, str):
            raise RenderError(f"{path}: object {index} (kind {kind!r}) is not a named Node or "
                              f"NodeResourceTopology; {SHAPES}")
        if kind == "Node":
            nodes.append(obj)
        else:
            if not isinstance(obj.get("zones", []), list):
                raise RenderError(f"{path}: NodeResourceTopology {name}: zones must be a list")
            topologies.append(obj)
    if not nodes:
        raise RenderError(f"{path}: no Node objects (NodeResourceTopologies alone carry no "
                          "labels or allocatable resources)")
    return nodes, topologies


SHAPES = ("expected a catalogue (a mapping with `nodes:`, each {name, arch, labels, capacity, "
          "threadsPerCore, numa: [{cpus, memory, devices}]}) or Node and NodeResourceTopology "
          "objects (a YAML stream, a list, or a kind: List)")


def _flatten(documents: list[Any]) -> list[Any]:
    objects: list[Any] = []
    for document in documents:
        if isinstance(document, list):
            objects.extend(_flatten(document))
        elif isinstance(document, dict) and str(document.get("kind", "")).endswith("List") \
                and isinstance(document.get("items"), list):
            objects.extend(_flatten(document["items"]))
        else:
            objects.append(document)
    return objects


def catalogue_node(path: str, index: int, entry: Any) -> tuple[dict, dict]:
    """One catalogue machine -> (Node, NodeResourceTopology) as a real cluster publishes them:
    the kubelet's and NFD's labels, allocatable = capacity, one NRT zone per NUMA node carrying
    its CPU ids (attribute `cpus`)."""
    from heteroserve_operator.numa import NumaPlanError, parse_cpu_list
    from heteroserve_operator.render.facts import (
        LABEL_CPUS_PER_NUMA_NODE,
        LABEL_NUMA_NODES,
        LABEL_SMT,
    )

    where = f"{path}: nodes[{index}]"
    if not isinstance(entry, dict):
        raise RenderError(f"{where}: expected a mapping; {SHAPES}")
    unknown = sorted(set(entry) - NODE_KEYS)
    if unknown:
        raise RenderError(f"{where}: unknown keys {unknown} (known: {sorted(NODE_KEYS)})")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise RenderError(f"{where}: name is required")
    where = f"{path}: node {name}"
    zones = entry.get("numa")
    if not isinstance(zones, list) or not zones:
        raise RenderError(f"{where}: numa must be a non-empty list of {{cpus, memory, "
                          "devices}}, one per NUMA node")
    counts = []
    for zone_index, zone in enumerate(zones):
        if not isinstance(zone, dict) or not isinstance(zone.get("cpus"), str):
            raise RenderError(f"{where}: numa[{zone_index}] needs cpus, a Linux CPU list "
                              "such as '0-31,128-159'")
        unknown = sorted(set(zone) - ZONE_KEYS)
        if unknown:
            raise RenderError(f"{where}: numa[{zone_index}]: unknown keys {unknown}")
        try:
            counts.append(len(parse_cpu_list(zone["cpus"])))
        except NumaPlanError as error:
            raise RenderError(f"{where}: numa[{zone_index}].cpus: {error}") from None
    for key in ("labels", "capacity", "allocatable"):
        if not isinstance(entry.get(key, {}), dict):
            raise RenderError(f"{where}: {key} must be a mapping")
    capacity = {k: str(v) for k, v in (entry.get("capacity") or {}).items()}
    capacity.setdefault("cpu", str(sum(counts)))
    if capacity["cpu"] != str(sum(counts)):
        raise RenderError(f"{where}: the NUMA nodes list {sum(counts)} CPUs but capacity.cpu "
                          f"is {capacity['cpu']}")
    try:
        threads = int(entry.get("threadsPerCore", 1))
    except (TypeError, ValueError):
        raise RenderError(f"{where}: threadsPerCore must be an integer") from None
    labels = {LABEL_OS: "linux", LABEL_HOSTNAME: name,
              LABEL_MEMORY_NUMA: str(len(zones) > 1).lower(),
              LABEL_SMT: str(threads > 1).lower(), LABEL_NUMA_NODES: str(len(zones))}
    if entry.get("arch"):
        labels[LABEL_ARCH] = str(entry["arch"])
    if len(set(counts)) == 1:
        labels[LABEL_CPUS_PER_NUMA_NODE] = str(counts[0])
    labels.update({k: str(v) for k, v in (entry.get("labels") or {}).items()})
    allocatable = {k: str(v) for k, v in (entry.get("allocatable") or capacity).items()}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"capacity": capacity, "allocatable": allocatable}}
    topology = {
        "apiVersion": NRT_API_VERSION, "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "zones": [{"name": f"node-{i}", "type": "Node",
                   "resources": [{"name": "cpu", "capacity": str(count),
                                  "allocatable": str(count), "available": str(count)}],
                   "attributes": [{"name": "cpus", "value": zone["cpus"]}]}
                  for i, (zone, count) in enumerate(zip(zones, counts, strict=True))],
    }
    return node, topology


def facts_from_objects(path: str, nodes: list[dict], topologies: list[dict]):
    """The operator's own conversion (reconcile.cluster_facts); malformed objects are bad
    input, not a traceback."""
    from heteroserve_operator.numa import NumaPlanError
    from heteroserve_operator.reconcile import cluster_facts

    try:
        return cluster_facts(nodes, topologies)
    except (NumaPlanError, KeyError, TypeError, ValueError, AttributeError) as error:
        raise RenderError(f"{path}: node facts: a malformed object ({type(error).__name__}: "
                          f"{error})"
                          ) from None


class ClusterReader:
    """--from-cluster: Nodes, NodeResourceTopologies and (for its uid) the InferenceDeployment,
    through the operator's API layer; reads only."""

    def __init__(self, context: str | None):
        from kubernetes import client, config

        from heteroserve_operator.kube import KubeApi

        try:
            try:
                config.load_kube_config(context=context)
            except config.ConfigException:
                if context:
                    raise
                config.load_incluster_config()
        except config.ConfigException as error:
            raise RenderError(f"--from-cluster: no usable kubeconfig: {error}") from None
        self.kube = KubeApi(client.ApiClient())

    def read(self, what: str, call, *args):
        from heteroserve_operator.kube import ApiError

        try:
            return call(*args)
        except ApiError as error:
            raise RenderError(f"--from-cluster: reading {what}: {error}") from None
        except Exception as error:  # connection errors of urllib3 and the like
            raise RenderError(f"--from-cluster: reading {what}: {type(error).__name__}: "
                              f"{error}") from None

    def uid(self, namespace: str, name: str) -> str | None:
        from heteroserve_operator.kube import ApiError

        try:
            body = self.kube.inference_deployment(namespace, name)
        except ApiError:  # not allowed to read it, or no CRD: the uid stays unknown
            return None
        return body["metadata"].get("uid") if body else None


# -- render -------------------------------------------------------------------------------------
def render_children(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """(the children, summary lines) for the parsed arguments."""
    from heteroserve_operator.numa import NumaPlanError
    from heteroserve_operator.render import kv_token
    from heteroserve_operator.render.children import render
    from heteroserve_operator.render.facts import ClusterFacts
    from heteroserve_operator.render.meta import Owner

    name, file_namespace, spec = validate(args.file, load_document(args.file))
    namespace = args.namespace or file_namespace or "default"
    uid = args.uid
    if args.nodes:
        facts = facts_from_objects(args.nodes, *load_node_objects(args.nodes))
        source = f"nodes from {args.nodes}"
    elif args.from_cluster:
        reader = ClusterReader(args.context)
        nodes = reader.read("Nodes", reader.kube.nodes)
        topologies = reader.read("NodeResourceTopologies", reader.kube.node_resource_topologies)
        facts = facts_from_objects("the cluster", nodes, topologies)
        source = f"{len(nodes)} nodes from the cluster"
        if uid is None:
            uid = reader.uid(namespace, name)
    else:
        facts = ClusterFacts()
        source = "no node facts (decode CPUs planned as on nodes that publish no NUMA layout)"
    owner = Owner(name, namespace, uid or "")
    try:
        rendered = render(spec, owner, facts)
    except NumaPlanError as error:
        raise RenderError(f"{args.file}: the plan does not fit ({source}): {error}") from None
    children = list(rendered.children)
    summary = [f"heteroserve render: InferenceDeployment {namespace}/{name} (dry run: nothing "
               "was applied)", f"node facts: {source}", f"endpoint: {rendered.endpoint}"]
    if rendered.placement:
        plan = rendered.placement.plan
        where = (", ".join(rendered.placement.nodes) if rendered.placement.nodes
                 else "any node (no node published its NUMA layout)")
        summary.append(f"decode: {plan.threads} threads on CPUs {plan.cpu_list} of NUMA "
                       f"node(s) {','.join(map(str, plan.numa_node_ids))}; plan holds on "
                       f"{where}")
    if not owner.uid:
        summary.append("ownerReferences: uid empty (known once applied; pass --uid)")
    if rendered.kv_token_secret:
        secret = kv_token.secret(owner, "")
        secret.pop("stringData")
        children.append(secret)
        summary.append(f"Secret {rendered.kv_token_secret}: created once by the operator with "
                       f"a random value under key {kv_token.TOKEN_KEY!r} (not shown)")
    return children, summary


def format_output(children: list[dict[str, Any]], summary: list[str], output: str) -> str:
    if output == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": children},
                          indent=2) + "\n"
    header = "".join(f"# {line}\n" for line in summary)
    return header + "".join("---\n" + yaml.safe_dump(child, sort_keys=False, width=100)
                            for child in children)


def main(args: argparse.Namespace) -> int:
    try:
        children, summary = render_children(args)
    except RenderError as error:
        print(f"heteroserve render: error: {error}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(format_output(children, summary, args.output))
        sys.stdout.flush()
    except BrokenPipeError:  # `heteroserve render ... | head`: the reader left, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0
