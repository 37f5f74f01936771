from __future__ import annotations

import pytest

from tests.cluster.catalogue import FakeNode, load_catalogue, parse_cpu_list


def test_cpu_list_syntax():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("0-31,128-159") == [*range(32), *range(128, 160)]
    assert parse_cpu_list("") == []


def test_catalogue_has_the_seed_machines():
    nodes = {node.name: node for node in load_catalogue()}
    kunpeng = nodes["kunpeng-a100-0"]
    assert [zone.cpu_count for zone in kunpeng.numa] == [40, 40, 40, 40]
    assert kunpeng.threads_per_core == 1 and kunpeng.arch == "arm64"
    assert kunpeng.capacity["nvidia.com/gpu"] == "8"
    sysinfer = nodes["kunpeng-cpu-0"]
    assert len(sysinfer.numa) == 4 and sysinfer.capacity["cpu"] == "256"
    assert sysinfer.threads_per_core == 2
    assert nodes["gaudi2-0"].capacity["hugepages-2Mi"] == "30000Mi"
    assert nodes["ascend-910-0"].capacity["huawei.com/Ascend910"] == "8"
    assert any(n.arch == "amd64" and "nvidia.com/gpu" not in n.capacity
               and "habana.ai/gaudi" not in n.capacity for n in nodes.values())


def test_topology_manifest_zones_and_distances():
    node = next(n for n in load_catalogue() if n.name == "kunpeng-a100-0")
    nrt = node.topology_manifest(node_uid="u-1")
    assert nrt["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    zone = nrt["zones"][1]
    assert zone["name"] == "node-1"
    assert [c["value"] for c in zone["costs"]] == [20, 10, 20, 20]
    assert {r["name"]: r["capacity"] for r in zone["resources"]} == {
        "cpu": "40", "memory": "256Gi", "nvidia.com/gpu": "2"}


def test_capacity_must_match_the_numa_zones():
    with pytest.raises(ValueError, match=r"NUMA zones list 8 CPUs but capacity\.cpu is 16"):
        FakeNode.from_dict({"name": "bad", "description": "", "arch": "amd64",
                            "capacity": {"cpu": 16}, "numa": [{"cpus": "0-7", "memory": "1Gi"}]})
