"""The fake-node catalogue (nodes.yaml) turned into Node and NodeResourceTopology objects.

Pure functions: data in, manifests out. The harness creates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from heteroserve_operator.numa import parse_cpu_list

CATALOGUE = Path(__file__).with_name("nodes.yaml")
NRT_GROUP, NRT_VERSION, NRT_PLURAL = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
# kwok manages only nodes carrying this annotation (its --manage-nodes-with-annotation-selector).
KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
LABEL_NUMA_NODES = "heteroserve.io/numa-nodes"
LABEL_NUMA_CPUS = "heteroserve.io/cpus-per-numa-node"
# NUMA distances as the ACPI SLIT reports them on two-hop-free machines: 10 local, 20 remote.
LOCAL_DISTANCE, REMOTE_DISTANCE = 10, 20


@dataclass(frozen=True)
class NumaZone:
    cpus: str
    memory: str
    devices: dict[str, str] = field(default_factory=dict)

    @property
    def cpu_count(self) -> int:
        return len(parse_cpu_list(self.cpus))


@dataclass(frozen=True)
class FakeNode:
    name: str
    description: str
    arch: str
    capacity: dict[str, str]
    numa: list[NumaZone]
    threads_per_core: int = 1
    topology_policy: str = "none"
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FakeNode:
        zones = [NumaZone(**zone) for zone in data["numa"]]
        node = cls(
            name=data["name"],
            description=data["description"],
            arch=data["arch"],
            capacity={k: str(v) for k, v in data["capacity"].items()},
            numa=zones,
            threads_per_core=int(data.get("threadsPerCore", 1)),
            topology_policy=data.get("topologyPolicy", "none"),
            labels={k: str(v) for k, v in data.get("labels", {}).items()},
        )
        total = sum(zone.cpu_count for zone in zones)
        if total != int(node.capacity["cpu"]):
            raise ValueError(
                f"{node.name}: NUMA zones list {total} CPUs but capacity.cpu is "
                f"{node.capacity['cpu']}"
            )
        return node

    def node_labels(self) -> dict[str, str]:
        counts = {zone.cpu_count for zone in self.numa}
        labels = {
            "kubernetes.io/arch": self.arch,
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": self.name,
            "type": "kwok",
            # What NFD publishes for NUMA-capable machines and SMT.
            "feature.node.kubernetes.io/memory-numa": str(len(self.numa) > 1).lower(),
            "feature.node.kubernetes.io/cpu-hardware_multithreading": str(
                self.threads_per_core > 1
            ).lower(),
            LABEL_NUMA_NODES: str(len(self.numa)),
        }
        if len(counts) == 1:
            labels[LABEL_NUMA_CPUS] = str(counts.pop())
        labels.update(self.labels)
        return labels

    def node_manifest(self) -> dict[str, Any]:
        """The Node with its status, for one create call."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": self.node_labels(),
                "annotations": {**KWOK_ANNOTATION, "heteroserve.io/description": self.description},
            },
            "status": {
                "capacity": dict(self.capacity),
                "allocatable": dict(self.capacity),
                "nodeInfo": {
                    "architecture": self.arch,
                    "operatingSystem": "linux",
                    "kubeletVersion": "fake",
                    "kubeProxyVersion": "fake",
                    "containerRuntimeVersion": "kwok",
                    "osImage": "openEuler 24.03 LTS" if self.arch == "arm64" else "Ubuntu 22.04",
                    "kernelVersion": "6.6.0",
                    "machineID": self.name,
                    "systemUUID": self.name,
                    "bootID": self.name,
                },
                "phase": "Running",
            },
        }

    def topology_manifest(self, node_uid: str | None = None) -> dict[str, Any]:
        """The NodeResourceTopology that nfd-topology-updater would publish for this node."""
        zones = []
        for index, zone in enumerate(self.numa):
            resources = [{"name": "cpu", "value": str(zone.cpu_count)}, {"name": "memory",
                         "value": zone.memory}]
            resources += [{"name": k, "value": v} for k, v in zone.devices.items()]
            zones.append(
                {
                    "name": f"node-{index}",
                    "type": "Node",
                    "costs": [
                        {
                            "name": f"node-{other}",
                            "value": LOCAL_DISTANCE if other == index else REMOTE_DISTANCE,
                        }
                        for other in range(len(self.numa))
                    ],
                    "resources": [
                        {
                            "name": r["name"],
                            "capacity": r["value"],
                            "allocatable": r["value"],
                            "available": r["value"],
                        }
                        for r in resources
                    ],
                    # Not published by NFD: the CPU ids of the zone, which the NUMA planner
                    # needs to render the seeds' CUSTOM_CPU_AFFINITY lists.
                    "attributes": [{"name": "cpus", "value": zone.cpus}],
                }
            )
        metadata: dict[str, Any] = {"name": self.name}
        if node_uid:
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node_uid}
            ]
        return {
            "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}",
            "kind": "NodeResourceTopology",
            "metadata": metadata,
            "attributes": [
                {"name": "topologyManagerPolicy", "value": self.topology_policy},
                {"name": "topologyManagerScope", "value": "pod"},
            ],
            "zones": zones,
        }


def load_catalogue(path: Path = CATALOGUE) -> list[FakeNode]:
    data = yaml.safe_load(path.read_text())
    nodes = [FakeNode.from_dict(entry) for entry in data["nodes"]]
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate node names in {names}")
    return nodes
