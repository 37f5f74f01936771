"""Which CPUs the engine's threads bind, from the seeds' environment variables.

Precedence: CUSTOM_CPU_AFFINITY (sysHAX, "a-b[:step],..."), then GOMP_CPU_AFFINITY (sysInfer,
libgomp syntax), then the process's own cpuset (the kubelet's exclusive cores). OMP_NUM_THREADS,
when set, must equal the number of bound CPUs, and every NUMA node used must contribute the same
number of CPUs — the seeds' two rules, enforced with an error that names the rule. sysHAX counts
OMP_NUM_THREADS only with INFERENCE_OP_MODE=fused; heteroserve's engine is always the fused path,
so it accepts that mode and refuses any other value.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..protocol.binding import (
    CUSTOM_CPU_AFFINITY,
    GOMP_CPU_AFFINITY,
    INFERENCE_OP_MODE,
    OMP_NUM_THREADS,
    CpuListError,
    parse_cpu_list,
)

NODE_ROOT = Path("/sys/devices/system/node")


class AffinityError(ValueError):
    """The requested binding breaks a seed rule or names CPUs the process cannot use."""


def _cpus(text: str) -> list[int]:
    try:
        return parse_cpu_list(text)
    except CpuListError as error:
        raise AffinityError(str(error)) from None


def numa_nodes_of(cpus: list[int], root: Path = NODE_ROOT) -> dict[int, int]:
    """CPU -> NUMA node from /sys; every CPU on node 0 when the machine reports no nodes."""
    mapping: dict[int, int] = {}
    for node in sorted(root.glob("node[0-9]*")) if root.exists() else []:
        cpulist = (node / "cpulist").read_text().strip()
        for cpu in _cpus(cpulist) if cpulist else []:
            mapping[cpu] = int(node.name[4:])
    return {cpu: mapping.get(cpu, 0) for cpu in cpus}


@dataclass(frozen=True)
class Binding:
    cpus: list[int]
    source: str
    numa: dict[int, int]

    @property
    def threads(self) -> int:
        return len(self.cpus)


def resolve(env: Mapping[str, str] | None = None, allowed: set[int] | None = None,
            root: Path = NODE_ROOT) -> Binding:
    env = os.environ if env is None else env
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    mode = env.get(INFERENCE_OP_MODE, "fused")
    if mode != "fused":
        raise AffinityError(f"INFERENCE_OP_MODE={mode!r}: this engine runs the fused CPU path "
                            "only (sysHAX's INFERENCE_OP_MODE=fused)")
    if env.get(CUSTOM_CPU_AFFINITY):
        cpus, source = _cpus(env[CUSTOM_CPU_AFFINITY]), CUSTOM_CPU_AFFINITY
    elif env.get(GOMP_CPU_AFFINITY):
        cpus, source = _cpus(env[GOMP_CPU_AFFINITY]), GOMP_CPU_AFFINITY
    else:
        cpus, source = sorted(allowed), "process cpuset"
        if env.get(OMP_NUM_THREADS):
            # Without an explicit list, OMP_NUM_THREADS picks that many CPUs of the cpuset,
            # spread evenly over its NUMA nodes.
            cpus = _even_subset(cpus, int(env[OMP_NUM_THREADS]), root)
    outside = sorted(set(cpus) - allowed)
    if outside:
        raise AffinityError(f"{source} binds CPUs {outside} that this process may not use "
                            f"(its cpuset: {sorted(allowed)})")
    threads = env.get(OMP_NUM_THREADS)
    if threads and int(threads) != len(cpus):
        raise AffinityError(f"OMP_NUM_THREADS={threads} but {source} binds {len(cpus)} CPUs: "
                            "the thread count must equal the number of bound CPUs")
    numa = numa_nodes_of(cpus, root)
    per_node = Counter(numa.values())
    if len(set(per_node.values())) > 1:
        detail = ", ".join(f"node {n}: {c}" for n, c in sorted(per_node.items()))
        raise AffinityError(f"{source} uses NUMA nodes unevenly ({detail}): every NUMA node "
                            "must contribute the same number of CPUs")
    return Binding(cpus, source, numa)


def _even_subset(cpus: list[int], count: int, root: Path) -> list[int]:
    by_node: dict[int, list[int]] = {}
    for cpu, node in numa_nodes_of(cpus, root).items():
        by_node.setdefault(node, []).append(cpu)
    nodes = sorted(by_node)
    for use in range(len(nodes), 0, -1):
        if count % use == 0 and all(len(by_node[n]) >= count // use for n in nodes[:use]):
            return sorted(c for n in nodes[:use] for c in by_node[n][: count // use])
    raise AffinityError(f"OMP_NUM_THREADS={count} cannot be spread evenly over the NUMA nodes "
                        f"of the cpuset {cpus}")
