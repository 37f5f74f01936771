"""This machine's NUMA layout, as the operator's NUMA planner sees a node.

Read from /sys (the NUMA nodes' CPU lists, each CPU's SMT siblings) and restricted to the CPUs
this process may run on (`os.sched_getaffinity`): a container or `taskset` narrows what the
engines can bind, as a pod's cpuset does.
"""

from __future__ import annotations

import os
from pathlib import Path

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.numa import NodeTopology, NumaNode, parse_cpu_list
from heteroserve_operator.render import same_node
from heteroserve_operator.render.accelerators import profile as accelerator_profile
from heteroserve_operator.render.facts import ClusterFacts, NodeFacts

SYS_ROOT = Path("/sys/devices/system")


def machine_topology(name: str, allowed: set[int] | None = None,
                     root: Path = SYS_ROOT) -> NodeTopology:
    """The NUMA nodes holding CPUs of `allowed` (default: this process's affinity), each node's
    CPUs ordered first hardware threads first, then their SMT siblings (the planner's order).
    A machine that reports no NUMA nodes is one node 0."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    nodes: list[tuple[int, list[int]]] = []
    node_root = root / "node"
    for node in sorted(node_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        text = (node / "cpulist").read_text().strip() if (node / "cpulist").exists() else ""
        cpus = [cpu for cpu in (parse_cpu_list(text) if text else []) if cpu in allowed]
        if cpus:  # memory-only nodes (CXL, HBM) hold no CPU
            nodes.append((int(node.name[4:]), cpus))
    if not nodes:
        nodes = [(0, sorted(allowed))]
    rank = {cpu: _sibling_rank(cpu, root) for _, cpus in nodes for cpu in cpus}
    ordered = [NumaNode(node_id, tuple(sorted(cpus, key=lambda c: (rank[c], c))))
               for node_id, cpus in nodes]
    return NodeTopology(name, tuple(ordered), _threads_per_core(nodes, rank))


def _sibling_rank(cpu: int, root: Path) -> int:
    """0 for a core's first hardware thread, 1 for its first sibling, ..."""
    path = root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        siblings = parse_cpu_list(path.read_text().strip())
    except OSError:
        return 0
    return siblings.index(cpu) if cpu in siblings else 0


def _threads_per_core(nodes: list[tuple[int, list[int]]], rank: dict[int, int]) -> int:
    """The planner splits a node's list into equal groups of first threads and siblings; when
    the affinity leaves the groups uneven (half a core), it is told 1: every CPU counts alike."""
    threads = max(rank.values(), default=0) + 1
    for _, cpus in nodes:
        counts = [sum(1 for c in cpus if rank[c] == r) for r in range(threads)]
        if len(set(counts)) > 1:
            return 1
    return threads


def machine_facts(topology: NodeTopology, spec: InferenceDeploymentSpec) -> ClusterFacts:
    """This machine as the only node: it holds every CPU of its topology and, when the spec has
    a prefill tier, its accelerators, and it carries the labels the spec selects on (one box is
    the node every selector means). Whether the accelerator engine really runs here is that
    engine's business."""
    labels: dict[str, str] = {}
    cpus = topology.cpu_count
    if spec.decode and same_node.shares_pod(spec):
        # The shared pod's prefill engine and router ask cores of their own in a cluster; here
        # they run unpinned beside the decode engine's, so only the decode CPUs must fit.
        cpus += same_node.pod_cpus(spec) - spec.decode.cpus
    allocatable = {"cpu": str(cpus)}
    if spec.decode:
        labels.update(spec.decode.node_selector)
    if spec.prefill:
        accel = accelerator_profile(spec.prefill.accelerator)
        labels.update({**accel.node_selector, **spec.prefill.node_selector})
        allocatable[accel.resource] = str(spec.prefill.accelerator.count)
    return ClusterFacts((NodeFacts(topology.name, labels, allocatable, topology),))
