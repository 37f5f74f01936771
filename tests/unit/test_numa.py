"""The NUMA planner: the seeds' cases, the rules' error messages, and property tests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroserve_operator.numa import (
    NodeTopology,
    NumaPlanError,
    format_cpu_list,
    parse_cpu_list,
    plan_cpus,
    topology_from_zones,
)

KUNPENG_7280Z = NodeTopology.uniform("kunpeng", 4, 40)  # 160 cores, no SMT (seed 000 lscpu)


@pytest.mark.parametrize(("topology", "cpus", "numa", "reserved", "expected"), [
    # sysHAX: OMP_NUM_THREADS=160 CUSTOM_CPU_AFFINITY=0-159
    (KUNPENG_7280Z, 160, 4, 0, "0-159"),
    # sysHAX guidance with spare cores: 120 threads
    (KUNPENG_7280Z, 120, 4, 0, "0-29,40-69,80-109,120-149"),
    # Kunpeng BoostKit: the GPU engine keeps the last 4 cores of each NUMA node
    (KUNPENG_7280Z, 128, 4, 4, "0-31,40-71,80-111,120-151"),
    # sysInfer: OMP_NUM_THREADS=88 GOMP_CPU_AFFINITY=0-21,24-45,48-69,72-93 on 4 nodes of 24
    (NodeTopology.uniform("sysinfer", 4, 24), 88, 4, 0, "0-21,24-45,48-69,72-93"),
    # SMT: physical cores first (128 cores / 256 threads over 4 nodes)
    (NodeTopology.uniform("smt", 4, 64, threads_per_core=2), 88, 4, 0,
     "0-21,32-53,64-85,96-117"),
    # fewer NUMA nodes than the machine has
    (KUNPENG_7280Z, 40, 2, 0, "0-19,40-59"),
])
def test_seed_cases(topology, cpus, numa, reserved, expected):
    plan = plan_cpus(topology, cpus, numa, reserved)
    assert plan.cpu_list == expected
    env = plan.environment()
    assert env == {"OMP_NUM_THREADS": str(cpus), "CUSTOM_CPU_AFFINITY": expected,
                   "GOMP_CPU_AFFINITY": expected}


def test_uneven_spread_is_rejected_with_the_rule():
    with pytest.raises(NumaPlanError, match="every NUMA node must contribute the same number"):
        plan_cpus(KUNPENG_7280Z, 90, 4)


def test_more_than_a_numa_node_holds_is_rejected():
    with pytest.raises(NumaPlanError, match="needs 41 CPUs on each, but NUMA node 0 of kunpeng "
                                            "has 40"):
        plan_cpus(KUNPENG_7280Z, 164, 4)


def test_reservation_is_named_in_the_error():
    with pytest.raises(NumaPlanError, match="4 are reserved for the accelerator engine"):
        plan_cpus(KUNPENG_7280Z, 160, 4, reserved_per_numa_node=4)


def test_too_many_numa_nodes_and_nonsense_requests():
    with pytest.raises(NumaPlanError, match="5 NUMA nodes requested but kunpeng has 4"):
        plan_cpus(KUNPENG_7280Z, 10, 5)
    with pytest.raises(NumaPlanError, match="at least 1 CPU"):
        plan_cpus(KUNPENG_7280Z, 0)


def test_cpu_list_syntax_round_trip_and_syshax_step():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("0-8:4") == [0, 4, 8]
    assert format_cpu_list([5, 0, 1, 2, 3, 8]) == "0-3,5,8"
    with pytest.raises(NumaPlanError, match="invalid CPU list element"):
        parse_cpu_list("3-1")
    with pytest.raises(NumaPlanError, match="invalid CPU list element"):
        parse_cpu_list("a-b")


def test_topology_from_zone_cpu_lists():
    topology = topology_from_zones("x", [(1, "16-31,48-63"), (0, "0-15,32-47")], 2)
    assert [n.id for n in topology.numa_nodes] == [0, 1]
    assert plan_cpus(topology, 8, 2).cpu_list == "0-3,16-19"


topologies = st.builds(
    NodeTopology.uniform, st.just("h"), st.integers(1, 8), st.integers(1, 64).map(lambda n: 2 * n),
    st.sampled_from([1, 2]))


@given(topology=topologies, data=st.data())
def test_plan_invariants(topology, data):
    numa = data.draw(st.integers(1, len(topology.numa_nodes)))
    reserved = data.draw(st.integers(0, 4))
    cpus = data.draw(st.integers(1, topology.cpu_count + 8))
    try:
        plan = plan_cpus(topology, cpus, numa, reserved)
    except NumaPlanError as error:
        per_node = len(topology.numa_nodes[0].cpus)
        cores = per_node // topology.threads_per_core
        usable = max(cores - reserved, 0) * topology.threads_per_core
        assert cpus % numa or cpus // numa > usable, str(error)
        return
    # The thread count equals the bound CPUs.
    assert plan.threads == cpus == len(set(plan.cpus))
    # Every NUMA node contributes the same number of CPUs, all its own.
    counts = {len(c) for _, c in plan.cpus_by_numa_node}
    assert counts == {cpus // numa}
    by_id = {n.id: set(n.cpus) for n in topology.numa_nodes}
    for node_id, chosen in plan.cpus_by_numa_node:
        assert set(chosen) <= by_id[node_id]
    # Physical cores before SMT siblings: a sibling is used only when all usable cores are.
    cores = len(topology.numa_nodes[0].cpus) // topology.threads_per_core
    for node_id, chosen in plan.cpus_by_numa_node:
        ordered = sorted(by_id[node_id])
        firsts = ordered[:cores][: max(cores - reserved, 0)]
        if any(c not in ordered[:cores] for c in chosen):
            assert set(firsts) <= set(chosen)
        # Reserved CPUs (the last cores of the node) are never bound.
        assert not set(chosen) & set(ordered[:cores][cores - reserved:] if reserved else [])
    assert parse_cpu_list(plan.cpu_list) == list(plan.cpus)
