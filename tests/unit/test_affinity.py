"""The engine's CPU binding from the seeds' environment variables, on a fake /sys NUMA tree."""

from __future__ import annotations

import pytest

from heteroserve_engines.cpu_engine.affinity import AffinityError, resolve
from heteroserve_engines.protocol.binding import CpuListError, parse_cpu_list


@pytest.fixture
def kunpeng(tmp_path):
    """/sys/devices/system/node of the sysHAX Kunpeng 920: 4 NUMA nodes of 40 CPUs."""
    for node in range(4):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(f"{node * 40}-{node * 40 + 39}\n")
    return tmp_path


ALL = set(range(160))


def test_syshax_binding(kunpeng):
    binding = resolve({"INFERENCE_OP_MODE": "fused", "OMP_NUM_THREADS": "160",
                       "CUSTOM_CPU_AFFINITY": "0-159"}, ALL, kunpeng)
    assert binding.cpus == list(range(160)) and binding.source == "CUSTOM_CPU_AFFINITY"
    assert set(binding.numa.values()) == {0, 1, 2, 3}


def test_sysinfer_gomp_binding(kunpeng):
    binding = resolve({"OMP_NUM_THREADS": "120", "GOMP_CPU_AFFINITY": "0-29,40-69,80-109,120-149"},
                      ALL, kunpeng)
    assert binding.threads == 120 and binding.source == "GOMP_CPU_AFFINITY"


def test_syshax_step_syntax():
    assert parse_cpu_list("0-6:2,40") == [0, 2, 4, 6, 40]
    with pytest.raises(CpuListError, match="names a CPU twice"):
        parse_cpu_list("0-3,2")


def test_thread_count_must_equal_bound_cpus(kunpeng):
    with pytest.raises(AffinityError, match="the thread count must equal the number of bound "
                                            "CPUs"):
        resolve({"OMP_NUM_THREADS": "100", "CUSTOM_CPU_AFFINITY": "0-159"}, ALL, kunpeng)


def test_numa_nodes_must_contribute_equally(kunpeng):
    with pytest.raises(AffinityError, match="every NUMA node must contribute the same number"):
        resolve({"CUSTOM_CPU_AFFINITY": "0-39,40-49"}, ALL, kunpeng)


def test_cpus_outside_the_cpuset_are_refused(kunpeng):
    with pytest.raises(AffinityError, match="may not use"):
        resolve({"CUSTOM_CPU_AFFINITY": "0-79"}, set(range(40)), kunpeng)


def test_only_the_fused_mode_is_accepted(kunpeng):
    with pytest.raises(AffinityError, match="INFERENCE_OP_MODE"):
        resolve({"INFERENCE_OP_MODE": "eager"}, ALL, kunpeng)


def test_cpuset_with_omp_num_threads_is_spread_evenly(kunpeng):
    binding = resolve({"OMP_NUM_THREADS": "8"}, ALL, kunpeng)
    assert binding.cpus == [0, 1, 40, 41, 80, 81, 120, 121]
    binding = resolve({}, set(range(40, 80)), kunpeng)
    assert binding.cpus == list(range(40, 80)) and binding.source == "process cpuset"


def test_nrc_comes_from_the_flag_then_the_environment(monkeypatch):
    from heteroserve_engines.cpu_engine.__main__ import build_parser, nrc_from

    parser = build_parser()
    monkeypatch.delenv("NRC", raising=False)
    assert nrc_from(parser, None) == 0  # by row width
    monkeypatch.setenv("NRC", "4")
    assert nrc_from(parser, None) == 4
    assert nrc_from(parser, 1) == 1


@pytest.mark.parametrize("value", ["3", "four", "-1"])
def test_bad_nrc_is_refused_by_name(monkeypatch, capsys, value):
    from heteroserve_engines.cpu_engine.__main__ import build_parser, nrc_from

    monkeypatch.setenv("NRC", value)
    with pytest.raises(SystemExit) as exit_info:
        nrc_from(build_parser(), None)
    assert exit_info.value.code == 2
    assert f"NRC must be 1, 2 or 4 (got '{value}')" in capsys.readouterr().err
