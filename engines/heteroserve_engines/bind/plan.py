"""From the granted CPUs and the node's topology to the engine's binding, by the seeds' rules.

The rules (sysHAX and sysInfer guides): the number of threads equals the number of bound CPUs, and
every NUMA node used contributes the same number of CPUs. The plan may also fix how many NUMA
nodes (`numa_nodes`) and how many CPUs on each (`threads_per_node`) the engine binds.

A grant that holds exactly the plan is bound whole. A larger grant (the shared pool of a pod that
is not Guaranteed, or a pod asking more CPUs than it binds) is trimmed: the NUMA nodes with the
most granted CPUs, and within each the first hardware thread of every core before any SMT sibling
(one compute thread per physical core first). A grant that cannot hold the plan is refused with
the reason; nothing is ever bound outside the grant.

Pure functions: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from ..protocol.binding import (
    CUSTOM_CPU_AFFINITY,
    GOMP_CPU_AFFINITY,
    OMP_NUM_THREADS,
    format_cpu_list,
)


class BindingRefused(ValueError):
    """The granted CPUs cannot carry the planned binding; the message says which rule fails."""


@dataclass(frozen=True)
class Topology:
    """The node's CPUs as the container sees them in /sys.

    `numa_node_of`: CPU -> NUMA node, for every online CPU (empty when the kernel reports no NUMA
    nodes: then every CPU counts as node 0). `core_of`: CPU -> the sorted hardware threads of its
    physical core (a CPU missing here is a core of its own)."""

    numa_node_of: Mapping[int, int]
    core_of: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def node(self, cpu: int) -> int | None:
        if not self.numa_node_of:
            return 0
        return self.numa_node_of.get(cpu)

    def thread_rank(self, cpu: int) -> int:
        """0 for a core's first hardware thread, 1 for its first SMT sibling, ..."""
        siblings = self.core_of.get(cpu, (cpu,))
        return siblings.index(cpu) if cpu in siblings else 0


@dataclass(frozen=True)
class Binding:
    """The CPUs the engine binds, by NUMA node, and what of the grant it leaves unbound."""

    cpus_by_node: tuple[tuple[int, tuple[int, ...]], ...]
    granted: tuple[int, ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for _, cpus in self.cpus_by_node for c in cpus))

    @property
    def threads(self) -> int:
        return len(self.cpus)

    @property
    def unbound(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.granted) - set(self.cpus)))

    def describe(self) -> str:
        nodes = ", ".join(f"NUMA node {n}: {len(c)}" for n, c in self.cpus_by_node)
        return f"{self.threads} threads on CPUs {format_cpu_list(self.cpus)} ({nodes})"


def environment(binding: Binding) -> dict[str, str]:
    """The variables every CPU engine reads: OMP_NUM_THREADS (the thread count, sysHAX and
    libgomp), CUSTOM_CPU_AFFINITY (sysHAX and heteroserve's engine) and GOMP_CPU_AFFINITY
    (sysInfer's libgomp: thread i on the i-th CPU of the list)."""
    cpu_list = format_cpu_list(binding.cpus)
    return {OMP_NUM_THREADS: str(binding.threads), CUSTOM_CPU_AFFINITY: cpu_list,
            GOMP_CPU_AFFINITY: cpu_list}


def _by_node(granted: Collection[int], topology: Topology) -> dict[int, list[int]]:
    by_node: dict[int, list[int]] = {}
    unknown = []
    for cpu in granted:
        node = topology.node(cpu)
        if node is None:
            unknown.append(cpu)
        else:
            by_node.setdefault(node, []).append(cpu)
    if unknown:
        raise BindingRefused(f"granted CPUs {format_cpu_list(unknown)} are on no NUMA node of "
                             "/sys/devices/system/node (offline?)")
    # Physical cores first: every core's first thread, then the first siblings, ...
    return {node: sorted(cpus, key=lambda c: (topology.thread_rank(c), c))
            for node, cpus in sorted(by_node.items())}


def _counts(by_node: Mapping[int, list[int]]) -> str:
    return ", ".join(f"node {n}: {len(c)}" for n, c in sorted(by_node.items()))


def plan_binding(granted: Collection[int], topology: Topology, *, numa_nodes: int | None = None,
                 threads_per_node: int | None = None) -> Binding:
    """The binding of `granted` CPUs: `numa_nodes` NUMA nodes (default: every node of the grant)
    with `threads_per_node` CPUs each (default: all of the grant's, which must then be equal)."""
    if numa_nodes is not None and numa_nodes < 1:
        raise BindingRefused(f"--numa-nodes must be at least 1 (got {numa_nodes})")
    if threads_per_node is not None and threads_per_node < 1:
        raise BindingRefused(f"--threads-per-node must be at least 1 (got {threads_per_node})")
    if not granted:
        raise BindingRefused("the process may run on no CPU at all")
    by_node = _by_node(granted, topology)
    grant = f"the grant {format_cpu_list(granted)} ({_counts(by_node)})"
    use = len(by_node) if numa_nodes is None else numa_nodes
    if len(by_node) < use:
        raise BindingRefused(
            f"{grant} spans {len(by_node)} NUMA node(s) but the plan binds {use}: ask the "
            "kubelet for CPUs on more NUMA nodes (a topology manager policy of single-numa-node "
            "would refuse such a pod; restricted or best-effort admit it)")
    # With more NUMA nodes granted than used, the nodes with the most CPUs, lowest id first.
    nodes = sorted(sorted(by_node, key=lambda n: (-len(by_node[n]), n))[:use])
    counts = {n: len(by_node[n]) for n in nodes}
    if threads_per_node is None:
        if len(set(counts.values())) > 1:
            raise BindingRefused(
                f"{grant} is uneven over NUMA nodes {nodes}: every NUMA node used must "
                "contribute the same number of CPUs (the seeds' rule); pass --threads-per-node to "
                "bind an equal share of each")
        per_node = counts[nodes[0]]
    else:
        per_node = threads_per_node
        short = [n for n in nodes if counts[n] < per_node]
        if short:
            raise BindingRefused(
                f"{grant} is smaller than the plan: {per_node} CPUs on each of {use} NUMA "
                f"node(s) ({per_node * use} threads), but " + ", ".join(
                    f"node {n} has {counts[n]}" for n in short)
                + ": the pod must request (and, for exclusive cores, be Guaranteed with) that "
                "many CPUs")
    return Binding(tuple((n, tuple(sorted(by_node[n][:per_node]))) for n in nodes),
                   tuple(sorted(granted)))
