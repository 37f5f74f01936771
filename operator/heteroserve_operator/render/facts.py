"""What the reconciler read from the cluster that rendering depends on: nodes and their NUMA
topology. Built by the I/O layer, consumed by pure functions."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..numa import NodeTopology, parse_cpu_list, topology_from_zones

LABEL_NUMA_NODES = "heteroserve.io/numa-nodes"
LABEL_CPUS_PER_NUMA_NODE = "heteroserve.io/cpus-per-numa-node"
LABEL_SMT = "feature.node.kubernetes.io/cpu-hardware_multithreading"


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=dict)
    topology: NodeTopology | None = None

    def allocatable_int(self, resource: str) -> int:
        value = self.allocatable.get(resource, "0")
        try:
            return int(value)
        except ValueError:
            return int(float(value.rstrip("m")) / 1000) if value.endswith("m") else 0


@dataclass(frozen=True)
class ClusterFacts:
    nodes: tuple[NodeFacts, ...] = ()


def topology_from_nrt(node_name: str, nrt: dict, threads_per_core: int = 1) -> NodeTopology | None:
    """A NodeResourceTopology object (v1alpha2) -> NodeTopology, when its zones carry CPU ids
    (attribute `cpus`) or at least CPU counts (then numbered node by node)."""
    zones = [z for z in nrt.get("zones", []) if z.get("type") == "Node"]
    if not zones:
        return None
    cpu_lists: list[tuple[int, str]] = []
    next_cpu = 0
    for index, zone in enumerate(sorted(zones, key=lambda z: _zone_index(z["name"]))):
        attrs = {a["name"]: a["value"] for a in zone.get("attributes", []) or []}
        if "cpus" in attrs:
            cpus = attrs["cpus"]
            next_cpu = max(parse_cpu_list(cpus), default=next_cpu - 1) + 1
        else:
            count = next((int(r["capacity"]) for r in zone.get("resources", [])
                          if r["name"] == "cpu"), 0)
            cpus = f"{next_cpu}-{next_cpu + count - 1}" if count else ""
            next_cpu += count
        cpu_lists.append((_zone_index(zone["name"], index), cpus))
    return topology_from_zones(node_name, cpu_lists, threads_per_core)


def _zone_index(name: str, fallback: int = 0) -> int:
    digits = "".join(ch for ch in name.rsplit("-", 1)[-1] if ch.isdigit())
    return int(digits) if digits else fallback


def topology_from_labels(node_name: str, labels: dict[str, str]) -> NodeTopology | None:
    """Fallback when no NodeResourceTopology exists: the NUMA shape from node labels."""
    try:
        numa = int(labels[LABEL_NUMA_NODES])
        per_node = int(labels[LABEL_CPUS_PER_NUMA_NODE])
    except (KeyError, ValueError):
        return None
    threads = 2 if labels.get(LABEL_SMT) == "true" else 1
    if per_node % threads:
        threads = 1
    return NodeTopology.uniform(node_name, numa, per_node, threads)
