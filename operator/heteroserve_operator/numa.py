"""The NUMA planner: which CPUs a CPU decode engine binds, by the seeds' rules.

Rules (sysHAX and sysInfer guides): the engine's thread count equals the number of bound CPUs, and
every NUMA node used contributes the same number of CPUs. Within a NUMA node, physical cores come
before their SMT siblings (Linux lists a node's first hardware threads first), and the CPUs
reserved for the accelerator engine and router (sameNode placement) are taken from the end of
each node, as Kunpeng BoostKit pins the GPU engine to the last cores of each node.

Pure functions: topology in, plan out. No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from heteroserve_engines.protocol.binding import (
    CUSTOM_CPU_AFFINITY,
    GOMP_CPU_AFFINITY,
    OMP_NUM_THREADS,
    CpuListError,
    format_cpu_list,
)
from heteroserve_engines.protocol.binding import parse_cpu_list as _parse_cpu_list


class NumaPlanError(ValueError):
    """The request cannot satisfy the seeds' binding rules on this topology."""


def parse_cpu_list(text: str) -> list[int]:
    """Linux CPU list syntax, with the sysHAX step form: "0-3,8,10-20:2" -> sorted CPU ids.

    The syntax is the engines' contract (CUSTOM_CPU_AFFINITY): the contracts package parses it."""
    try:
        return sorted(_parse_cpu_list(text))
    except CpuListError as error:
        raise NumaPlanError(str(error)) from None


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its id and its CPU ids in the kernel's order."""

    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class NodeTopology:
    """A machine's NUMA layout, as read from NodeResourceTopology, labels or /sys."""

    name: str
    numa_nodes: tuple[NumaNode, ...]
    threads_per_core: int = 1

    @property
    def cpu_count(self) -> int:
        return sum(len(n.cpus) for n in self.numa_nodes)

    @classmethod
    def uniform(cls, name: str, numa_nodes: int, cpus_per_node: int,
                threads_per_core: int = 1) -> NodeTopology:
        """The layout Linux gives a machine whose CPUs are numbered node by node, with SMT
        siblings numbered after all first threads (0-39 on node 0, 40-79 on node 1, ...)."""
        if numa_nodes < 1 or cpus_per_node < 1:
            raise NumaPlanError("a topology needs at least one NUMA node with one CPU")
        if cpus_per_node % threads_per_core:
            raise NumaPlanError(
                f"{cpus_per_node} CPUs per NUMA node is not a multiple of {threads_per_core} "
                "threads per core")
        cores = cpus_per_node // threads_per_core
        total_cores = cores * numa_nodes
        nodes = []
        for node in range(numa_nodes):
            ids = [
                thread * total_cores + node * cores + core
                for thread in range(threads_per_core)
                for core in range(cores)
            ]
            nodes.append(NumaNode(node, tuple(ids)))
        return cls(name, tuple(nodes), threads_per_core)


@dataclass(frozen=True)
class NumaPlan:
    """The CPUs one decode engine binds, and the environment that tells it so."""

    node: str
    cpus_by_numa_node: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for _, cpus in self.cpus_by_numa_node for c in cpus))

    @property
    def threads(self) -> int:
        return len(self.cpus)

    @property
    def cpu_list(self) -> str:
        return format_cpu_list(self.cpus)

    @property
    def numa_node_ids(self) -> tuple[int, ...]:
        return tuple(node for node, _ in self.cpus_by_numa_node)

    def environment(self) -> dict[str, str]:
        """OMP_NUM_THREADS with the affinity in both seeds' variables: sysHAX reads
        CUSTOM_CPU_AFFINITY, sysInfer (libgomp) reads GOMP_CPU_AFFINITY."""
        return {
            OMP_NUM_THREADS: str(self.threads),
            CUSTOM_CPU_AFFINITY: self.cpu_list,
            GOMP_CPU_AFFINITY: self.cpu_list,
        }


def plan_cpus(
    topology: NodeTopology,
    cpus: int,
    numa_nodes: int | None = None,
    reserved_per_numa_node: int = 0,
) -> NumaPlan:
    """Chooses `cpus` CPUs spread evenly over `numa_nodes` NUMA nodes (all of them when None).

    The lowest-numbered NUMA nodes are used first; in each, physical cores first, skipping the
    last `reserved_per_numa_node` CPUs of the node's physical cores.
    """
    available_nodes = len(topology.numa_nodes)
    use = available_nodes if numa_nodes is None else numa_nodes
    if cpus < 1:
        raise NumaPlanError(f"a decode engine needs at least 1 CPU, got {cpus}")
    if use < 1 or use > available_nodes:
        raise NumaPlanError(
            f"{use} NUMA nodes requested but {topology.name} has {available_nodes}")
    if cpus % use:
        raise NumaPlanError(
            f"{cpus} CPUs cannot be spread evenly over {use} NUMA nodes: every NUMA node must "
            f"contribute the same number of CPUs (the thread count equals the bound CPUs), so "
            f"the CPU count must be a multiple of {use}")
    if reserved_per_numa_node < 0:
        raise NumaPlanError("reserved CPUs per NUMA node cannot be negative")
    per_node = cpus // use
    chosen: list[tuple[int, tuple[int, ...]]] = []
    for node in topology.numa_nodes[:use]:
        usable = _usable_cpus(node, topology.threads_per_core, reserved_per_numa_node)
        if per_node > len(usable):
            raise NumaPlanError(
                f"{cpus} CPUs over {use} NUMA nodes needs {per_node} CPUs on each, but NUMA node "
                f"{node.id} of {topology.name} has {len(node.cpus)}"
                + (f" of which {reserved_per_numa_node} are reserved for the accelerator engine "
                   f"and router" if reserved_per_numa_node else ""))
        chosen.append((node.id, tuple(sorted(usable[:per_node]))))
    return NumaPlan(topology.name, tuple(chosen))


def _usable_cpus(node: NumaNode, threads_per_core: int, reserved: int) -> list[int]:
    """The node's CPUs in preference order, without the reserved ones.

    The kernel lists a node's first hardware threads first, then the siblings (0-31,128-159):
    the first 1/threads_per_core of the list are physical cores. Reservation takes the last
    physical cores and their siblings.
    """
    cpus = list(node.cpus)
    cores = len(cpus) // max(threads_per_core, 1)
    groups = [cpus[t * cores:(t + 1) * cores] for t in range(max(threads_per_core, 1))]
    keep = max(cores - reserved, 0)
    return [cpu for group in groups for cpu in group[:keep]]


def topology_from_zones(name: str, zones: Sequence[tuple[int, str]],
                        threads_per_core: int = 1) -> NodeTopology:
    """From (NUMA node id, Linux CPU list) pairs, e.g. NodeResourceTopology zones."""
    nodes = tuple(NumaNode(node_id, tuple(parse_cpu_list(cpus)))
                  for node_id, cpus in sorted(zones))
    return NodeTopology(name, nodes, threads_per_core)
