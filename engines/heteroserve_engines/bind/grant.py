"""What the container was granted, read from the kernel: the I/O half of `heteroserve-bind`.

- `sched_getaffinity(0)`: the CPUs this process may run on (narrowed by `taskset`, and by the
  kernel to the cgroup's cpuset).
- The cpuset of the process's own cgroup, from /proc/self/cgroup: cgroup v2 `0::<path>` ->
  `<cgroup root>/<path>/cpuset.cpus.effective`; cgroup v1 `<id>:cpuset:<path>` ->
  `<cgroup root>/cpuset/<path>/cpuset.effective_cpus` (else `cpuset.cpus`). That path is the
  host's view; inside a container without a cgroup namespace the mount shows the container's own
  cgroup at its root, so the lookup walks up from `<root>/<path>` to the first directory that has
  the file (also what v2 needs when the cpuset controller is enabled only higher up).
- The NUMA nodes from `<sys>/devices/system/node/node*/cpulist`, each CPU's core from
  `<sys>/devices/system/cpu/cpu<N>/topology/thread_siblings_list`.

Every root is a parameter, so the tests run on fake trees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..protocol.binding import CpuListError, format_cpu_list, parse_cpu_list
from .plan import BindingRefused, Topology

SYS_ROOT = Path("/sys")
PROC_ROOT = Path("/proc")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Grant:
    """The CPUs the process may use, and where each part of that answer came from."""

    cpus: frozenset[int]
    affinity: frozenset[int]
    cpuset: frozenset[int] | None
    cpuset_file: Path | None

    def describe(self) -> str:
        where = f"sched_getaffinity {format_cpu_list(self.affinity)}"
        if self.cpuset is not None:
            where += f", cpuset {format_cpu_list(self.cpuset)} from {self.cpuset_file}"
        else:
            where += ", no cgroup cpuset found"
        return f"granted CPUs {format_cpu_list(self.cpus)} ({where})"


def _cpu_list(text: str, source: Path) -> list[int]:
    try:
        return parse_cpu_list(text.strip())
    except CpuListError as error:
        raise BindingRefused(f"{source}: {error}") from None


def _within(root: Path, cgroup_path: str) -> Iterable[Path]:
    """`root/cgroup_path`, then each parent up to `root`."""
    parts = PurePosixPath(cgroup_path).parts[1:] if cgroup_path.startswith("/") else ()
    for depth in range(len(parts), -1, -1):
        yield root.joinpath(*parts[:depth])


def cpuset_file(proc_root: Path = PROC_ROOT, cgroup_root: Path = CGROUP_ROOT) -> Path | None:
    """The file holding this process's cgroup cpuset, or None (no cgroup fs, no cpuset
    controller)."""
    try:
        lines = (proc_root / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in lines:
        _hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpuset" in controllers.split(","):
            v1 = path
        elif controllers == "":
            v2 = path
    # The cpuset controller is in one hierarchy only: a v1 cpuset line wins over a hybrid
    # host's v2 tree, which then has no cpuset files.
    if v1 is not None:
        candidates = [(d, name) for d in _within(cgroup_root / "cpuset", v1)
                      for name in ("cpuset.effective_cpus", "cpuset.cpus")]
    elif v2 is not None:
        candidates = [(d, "cpuset.cpus.effective") for d in _within(cgroup_root, v2)]
    else:
        return None
    for directory, name in candidates:
        if (directory / name).is_file() and (directory / name).read_text().strip():
            return directory / name
    return None


def read_grant(affinity: Iterable[int], proc_root: Path = PROC_ROOT,
               cgroup_root: Path = CGROUP_ROOT) -> Grant:
    """The CPUs in both the affinity mask and the cgroup's cpuset (the kernel keeps the first
    inside the second; a cpuset changed since start, or a narrower `taskset`, can differ)."""
    allowed = frozenset(affinity)
    found = cpuset_file(proc_root, cgroup_root)
    cpuset = frozenset(_cpu_list(found.read_text(), found)) if found else None
    cpus = allowed & cpuset if cpuset is not None else allowed
    return Grant(cpus, allowed, cpuset, found)


def read_topology(cpus: Iterable[int], sys_root: Path = SYS_ROOT) -> Topology:
    """The NUMA node of every online CPU, and the core of each of `cpus`."""
    node_root = sys_root / "devices" / "system" / "node"
    numa_node_of: dict[int, int] = {}
    for node in sorted(node_root.glob("node[0-9]*")) if node_root.is_dir() else []:
        path = node / "cpulist"
        for cpu in _cpu_list(path.read_text(), path) if path.is_file() else []:
            numa_node_of[cpu] = int(node.name[4:])
    core_of: dict[int, tuple[int, ...]] = {}
    for cpu in cpus:
        path = sys_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        path = path / "thread_siblings_list"
        if path.is_file():
            core_of[cpu] = tuple(sorted(_cpu_list(path.read_text(), path)))
    return Topology(numa_node_of, core_of)
