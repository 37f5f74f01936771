"""`heteroserve-bind` on fake /sys, /proc and cgroup trees: the binding computed from what the
container was granted, the seeds' rules checked on it, the variables exported and the engine
exec'd (a recording exec here; tests/e2e/test_binding_entrypoint.py runs the real one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from heteroserve_engines.bind.__main__ import main
from heteroserve_engines.bind.grant import read_grant, read_topology
from heteroserve_engines.bind.plan import BindingRefused, plan_binding
from heteroserve_engines.cpu_engine.affinity import resolve
from heteroserve_engines.protocol.binding import BINDING_VARIABLES, parse_cpu_list

ENGINE = ["heteroserve-cpu-engine", "--port", "8002"]


@dataclass
class Node:
    """A fake machine: sysfs, procfs and cgroup fs roots under one temporary directory."""

    root: Path
    execs: list[tuple[str, list[str], dict[str, str]]] = field(default_factory=list)

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def cgroup(self) -> Path:
        return self.root / "cgroup"

    @property
    def termination_log(self) -> Path:
        return self.root / "termination-log"

    def numa(self, *cpulists: str) -> Node:
        for node, cpulist in enumerate(cpulists):
            path = self.sys / "devices" / "system" / "node" / f"node{node}"
            path.mkdir(parents=True)
            (path / "cpulist").write_text(cpulist + "\n")
        return self

    def smt(self, *cores: str) -> Node:
        """Each argument: one physical core's thread_siblings_list ("0,8")."""
        for core in cores:
            for cpu in parse_cpu_list(core):
                path = self.sys / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
                path.mkdir(parents=True)
                (path / "thread_siblings_list").write_text(core + "\n")
        return self

    def cgroup_v2(self, path: str, cpus: str, at: str | None = None) -> Node:
        """/proc/self/cgroup names `path`; the cpuset file lives at `at` (default: `path`)."""
        self._self_cgroup(f"0::{path}\n")
        directory = self.cgroup / (at if at is not None else path).lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpuset.cpus.effective").write_text(cpus + "\n")
        return self

    def cgroup_v1(self, path: str, cpus: str, at: str | None = None) -> Node:
        self._self_cgroup(f"12:memory:{path}\n4:cpuset:{path}\n3:cpu,cpuacct:{path}\n"
                          "0::/\n")
        directory = self.cgroup / "cpuset" / (at if at is not None else path).lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpuset.cpus").write_text(cpus + "\n")
        return self

    def _self_cgroup(self, text: str) -> None:
        (self.proc / "self").mkdir(parents=True, exist_ok=True)
        (self.proc / "self" / "cgroup").write_text(text)

    def bind(self, *options: str, affinity: str | None = None,
             environ: dict[str, str] | None = None) -> int:
        """Runs the entrypoint on this machine; `affinity` defaults to every CPU of /sys."""
        if affinity is None:
            affinity = ",".join(p.read_text().strip() for p in
                                sorted((self.sys / "devices/system/node").glob("node*/cpulist")))
        return main([*options, "--sys-root", str(self.sys), "--proc-root", str(self.proc),
                     "--cgroup-root", str(self.cgroup), "--termination-log",
                     str(self.termination_log), "--", *ENGINE],
                    affinity=lambda: set(parse_cpu_list(affinity)),
                    environ={"PATH": "/usr/bin", **(environ or {})},
                    execvpe=lambda file, args, env: self.execs.append((file, args, env)))

    @property
    def exported(self) -> dict[str, str]:
        assert len(self.execs) == 1, self.execs
        file, args, env = self.execs[0]
        assert file == ENGINE[0] and args == ENGINE
        return {k: env[k] for k in BINDING_VARIABLES}


@pytest.fixture
def kunpeng(tmp_path) -> Node:
    """The sysHAX Kunpeng 920: 4 NUMA nodes of 40 CPUs, no SMT."""
    return Node(tmp_path).numa("0-39", "40-79", "80-119", "120-159")


def binding(cpus: str) -> dict[str, str]:
    threads = len(parse_cpu_list(cpus))
    return {"OMP_NUM_THREADS": str(threads), "CUSTOM_CPU_AFFINITY": cpus,
            "GOMP_CPU_AFFINITY": cpus}


def test_a_grant_that_fits_the_plan_is_bound_whole_and_the_engine_execd(kunpeng, capsys):
    # The static CPU manager gave this replica 20 cores on each of NUMA nodes 1 and 2: the
    # binding is those cores, whatever the pod spec said (today's operator renders 0-...).
    kunpeng.cgroup_v2("/kubepods.slice/pod1/cri-containerd-c1.scope", "40-59,80-99")
    rc = kunpeng.bind("--numa-nodes", "2", "--threads-per-node", "20",
                      environ={"CUSTOM_CPU_AFFINITY": "0-19,40-59", "OMP_NUM_THREADS": "40",
                               "SYSHAX_QUANTIZE": "q8_0"})
    assert rc == 0
    assert kunpeng.exported == binding("40-59,80-99")
    env = kunpeng.execs[0][2]
    assert env["PATH"] == "/usr/bin" and env["SYSHAX_QUANTIZE"] == "q8_0"
    err = capsys.readouterr().err
    assert "40 threads on CPUs 40-59,80-99 (NUMA node 1: 20, NUMA node 2: 20)" in err
    # OMP_NUM_THREADS=40 was right already; the stale list is replaced.
    assert "replaced the pod's CUSTOM_CPU_AFFINITY with the granted binding" in err
    assert not kunpeng.termination_log.exists()


def test_the_builtin_engine_accepts_what_the_entrypoint_exports(kunpeng):
    kunpeng.cgroup_v2("/", "40-59,80-99")
    assert kunpeng.bind("--numa-nodes", "2") == 0
    granted = set(parse_cpu_list("40-59,80-99"))
    engine = resolve(kunpeng.exported, granted, kunpeng.sys / "devices/system/node")
    assert engine.cpus == sorted(granted) and engine.threads == 40
    assert engine.source == "CUSTOM_CPU_AFFINITY"


def test_without_a_plan_every_granted_cpu_is_bound(kunpeng):
    kunpeng.cgroup_v2("/", "0-159")
    assert kunpeng.bind() == 0
    assert kunpeng.exported == binding("0-159")


def test_a_grant_spanning_numa_nodes_unequally_is_refused_loudly(kunpeng, capsys):
    kunpeng.termination_log.write_text("")
    kunpeng.cgroup_v2("/kubepods/pod1/c1", "0-29,40-49")
    assert kunpeng.bind() == 2
    assert kunpeng.execs == []
    err = capsys.readouterr().err
    assert "the grant 0-29,40-49 (node 0: 30, node 1: 10) is uneven over NUMA nodes [0, 1]" in err
    assert "every NUMA node used must contribute the same number of CPUs" in err
    assert kunpeng.termination_log.read_text() == err.strip().splitlines()[-1] + "\n"


def test_an_unequal_grant_with_an_equal_share_of_each_node_is_trimmed(kunpeng):
    kunpeng.cgroup_v2("/", "0-29,40-49")
    assert kunpeng.bind("--threads-per-node", "10") == 0
    assert kunpeng.exported == binding("0-9,40-49")


def test_a_grant_smaller_than_the_plan_is_refused(kunpeng, capsys):
    kunpeng.termination_log.write_text("stale\n")
    kunpeng.cgroup_v2("/", "0-9,40-59")
    assert kunpeng.bind("--numa-nodes", "2", "--threads-per-node", "20") == 2
    assert kunpeng.execs == []
    message = kunpeng.termination_log.read_text()
    assert "smaller than the plan: 20 CPUs on each of 2 NUMA node(s) (40 threads)" in message
    assert "node 0 has 10" in message and "node 1" not in message.split("but", 1)[1]
    assert message.strip() in capsys.readouterr().err


def test_a_grant_on_fewer_numa_nodes_than_planned_is_refused(kunpeng):
    kunpeng.termination_log.write_text("")
    kunpeng.cgroup_v2("/", "0-39")
    assert kunpeng.bind("--numa-nodes", "4", "--threads-per-node", "10") == 2
    assert "spans 1 NUMA node(s) but the plan binds 4" in kunpeng.termination_log.read_text()


def test_the_termination_log_is_written_only_where_it_exists(kunpeng):
    kunpeng.cgroup_v2("/", "0-39")
    assert kunpeng.bind("--numa-nodes", "2") == 2
    assert not kunpeng.termination_log.exists()


def test_a_shared_pool_larger_than_the_plan_is_trimmed_to_the_plan(kunpeng, capsys):
    # Not Guaranteed (or CPU manager `none`): the cpuset is the whole node.
    kunpeng.cgroup_v2("/kubepods/burstable/pod1/c1", "0-159")
    assert kunpeng.bind("--numa-nodes", "2", "--threads-per-node", "20") == 0
    assert kunpeng.exported == binding("0-19,40-59")
    assert "120 granted CPU(s) left unbound" in capsys.readouterr().err


def test_the_fullest_numa_nodes_are_chosen_when_the_grant_spans_more(kunpeng):
    kunpeng.cgroup_v2("/", "30-39,40-79,80-119")
    assert kunpeng.bind("--numa-nodes", "2") == 0
    assert kunpeng.exported == binding("40-119")


def test_cgroup_v1_cpuset_of_the_process_cgroup(kunpeng):
    kunpeng.cgroup_v1("/kubepods/pod1/c1", "80-99")
    (kunpeng.cgroup / "cpuset" / "cpuset.cpus").write_text("0-159\n")  # the root, not ours
    assert kunpeng.bind() == 0
    assert kunpeng.exported == binding("80-99")


def test_cgroup_v1_inside_a_container_that_mounts_its_own_cgroup_at_the_root(kunpeng):
    # No cgroup namespace: /proc/self/cgroup names the host's path, the mount shows our cgroup.
    kunpeng.cgroup_v1("/kubepods/pod1/c1", "120-127", at="/")
    assert kunpeng.bind() == 0
    assert kunpeng.exported == binding("120-127")


def test_cgroup_v2_cpuset_of_the_process_cgroup(kunpeng):
    kunpeng.cgroup_v2("/kubepods.slice/pod1/c1", "0-3,40-43")
    (kunpeng.cgroup / "cpuset.cpus.effective").write_text("0-159\n")
    assert kunpeng.bind() == 0
    assert kunpeng.exported == binding("0-3,40-43")


def test_cgroup_v2_without_the_controller_in_the_leaf_reads_the_nearest_parent(kunpeng):
    kunpeng.cgroup_v2("/kubepods.slice/pod1/c1", "8-15", at="/kubepods.slice/pod1")
    (kunpeng.cgroup / "kubepods.slice/pod1/c1").mkdir()
    assert kunpeng.bind() == 0
    assert kunpeng.exported == binding("8-15")


def test_the_cpuset_narrows_a_wider_affinity_and_taskset_narrows_the_cpuset(kunpeng):
    kunpeng.cgroup_v2("/", "0-7")
    grant = read_grant(set(range(160)), kunpeng.proc, kunpeng.cgroup)
    assert grant.cpus == set(range(8)) and grant.cpuset_file == kunpeng.cgroup / (
        "cpuset.cpus.effective")
    assert kunpeng.bind(affinity="2-3") == 0  # `taskset -c 2-3` inside the container
    assert kunpeng.exported == binding("2-3")


def test_no_cgroup_fs_falls_back_to_the_affinity(kunpeng):
    grant = read_grant({5, 6}, kunpeng.proc, kunpeng.cgroup)
    assert grant.cpus == {5, 6} and grant.cpuset is None


def test_smt_siblings_physical_cores_first(tmp_path):
    # 2 NUMA nodes of 4 cores x 2 threads, siblings numbered after all first threads (Linux).
    node = Node(tmp_path).numa("0-3,8-11", "4-7,12-15").smt(
        *(f"{c},{c + 8}" for c in range(8)))
    node.cgroup_v2("/", "0-1,8-9,4-5,12-13")  # the static CPU manager's whole cores
    assert node.bind("--threads-per-node", "2") == 0
    assert node.exported == binding("0-1,4-5")  # one thread per physical core
    node.execs.clear()
    assert node.bind() == 0  # no plan: every granted hardware thread
    assert node.exported == binding("0-1,4-5,8-9,12-13")


def test_smt_siblings_numbered_next_to_each_other(tmp_path):
    # Some machines number a core's threads next to each other (0,1 on one core).
    node = Node(tmp_path).numa("0-7").smt("0-1", "2-3", "4-5", "6-7")
    topology = read_topology(range(8), node.sys)
    assert topology.core_of[3] == (2, 3)
    assert plan_binding(set(range(6)), topology, threads_per_node=3).cpus == (0, 2, 4)
    planned = plan_binding(set(range(6)), topology, threads_per_node=4)
    assert planned.cpus == (0, 1, 2, 4) and planned.unbound == (3, 5)
    node.cgroup_v2("/", "0-5")
    assert node.bind("--threads-per-node", "3") == 0
    assert node.exported == binding("0,2,4")


def test_a_cpu_on_no_numa_node_is_refused(kunpeng):
    with pytest.raises(BindingRefused, match="on no NUMA node"):
        plan_binding({0, 200}, read_topology([0, 200], kunpeng.sys))


def test_a_machine_without_numa_nodes_counts_one(tmp_path):
    node = Node(tmp_path)
    node.cgroup_v2("/", "0-3")
    assert node.bind(affinity="0-3") == 0
    assert node.exported == binding("0-3")
    node.termination_log.write_text("")
    assert node.bind("--numa-nodes", "2", affinity="0-3") == 2


def test_no_engine_command_is_a_usage_error(capsys):
    assert main(["--numa-nodes", "1"], execvpe=lambda *a: pytest.fail("exec'd")) == 2
    assert "no engine command after `--`" in capsys.readouterr().err


def test_an_engine_command_that_is_not_found_exits_127(kunpeng, capsys):
    kunpeng.cgroup_v2("/", "0-3")
    rc = main(["--sys-root", str(kunpeng.sys), "--proc-root", str(kunpeng.proc),
               "--cgroup-root", str(kunpeng.cgroup), "--", "heteroserve-no-such-engine"],
              affinity=lambda: {0, 1, 2, 3}, environ={"PATH": str(kunpeng.root)})
    assert rc == 127
    assert "cannot run 'heteroserve-no-such-engine'" in capsys.readouterr().err


@pytest.mark.parametrize("options", [["--numa-nodes", "0"], ["--threads-per-node", "0"]])
def test_nonsense_plans_are_refused(kunpeng, options):
    kunpeng.cgroup_v2("/", "0-3")
    assert kunpeng.bind(*options) == 2
