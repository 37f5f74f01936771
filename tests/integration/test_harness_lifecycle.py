"""Starting and stopping a second, independent cluster leaves no process behind."""

from __future__ import annotations

import os

import pytest

from tests.cluster.harness import ControlPlane, HarnessError, recorded_pids

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_teardown_leaves_no_process_behind(tmp_path, cluster):
    # `cluster` first: the binaries are built and a first cluster runs beside this one.
    plane = ControlPlane(tmp_path / "second", log=lambda _m: None)
    plane.start()
    pids = recorded_pids(plane.workdir)
    assert sorted(name for _pid, name in pids) == sorted(
        ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"])
    assert all(_alive(pid) for pid, _name in pids)
    with pytest.raises(HarnessError, match="already runs"):
        ControlPlane(plane.workdir).start()
    plane.stop()
    assert [name for pid, name in pids if _alive(pid)] == []
    assert not (plane.workdir / "pids").exists()
