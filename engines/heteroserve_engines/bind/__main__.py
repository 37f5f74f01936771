"""`heteroserve-bind [--numa-nodes N] [--threads-per-node K] -- <engine command...>`

Binds the CPU decode engine to the CPUs this container was granted (its affinity mask and cgroup
cpuset), checks the seeds' rules on them (threads = bound CPUs, the same number of CPUs on each
NUMA node used, the planned number of NUMA nodes and CPUs per node), exports OMP_NUM_THREADS,
CUSTOM_CPU_AFFINITY and GOMP_CPU_AFFINITY (replacing any value the pod spec set) and execs the
engine in its place. A grant that breaks a rule exits 2 with the reason on stderr and in the
container's termination message (/dev/termination-log), without starting the engine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .grant import CGROUP_ROOT, PROC_ROOT, SYS_ROOT, read_grant, read_topology
from .plan import BindingRefused, environment, plan_binding

TERMINATION_LOG = Path("/dev/termination-log")
PROG = "heteroserve-bind"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} [options] -- <engine command...>", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--numa-nodes", type=int, default=None,
                        help="NUMA nodes the engine binds (default: every node of the grant)")
    parser.add_argument("--threads-per-node", type=int, default=None,
                        help="CPUs bound on each NUMA node (default: all granted there, which "
                             "must then be the same on every node)")
    parser.add_argument("--sys-root", type=Path, default=SYS_ROOT,
                        help="sysfs mount (tests point it at a fake tree)")
    parser.add_argument("--proc-root", type=Path, default=PROC_ROOT, help="procfs mount")
    parser.add_argument("--cgroup-root", type=Path, default=CGROUP_ROOT,
                        help="cgroup fs mount (v2, or the v1 hierarchies' parent)")
    parser.add_argument("--termination-log", type=Path, default=TERMINATION_LOG,
                        help="where the reason of a refusal goes (the kubelet's "
                             "terminationMessagePath), when writable")
    return parser


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Options before the first `--`, the engine's command line after it."""
    if "--" not in argv:
        return list(argv), []
    index = list(argv).index("--")
    return list(argv[:index]), list(argv[index + 1:])


def refuse(reason: str, termination_log: Path) -> int:
    message = f"{PROG}: {reason}"
    print(message, file=sys.stderr, flush=True)
    # The kubelet mounts the file (terminationMessagePath); elsewhere, or read-only, stderr has it.
    if termination_log.exists():
        with contextlib.suppress(OSError):
            termination_log.write_text(message + "\n")
    return 2


def main(argv: Sequence[str] | None = None, *,
         affinity: Callable[[], set[int]] = lambda: os.sched_getaffinity(0),
         environ: Mapping[str, str] | None = None,
         execvpe: Callable[[str, list[str], dict[str, str]], object] = os.execvpe) -> int:
    """Returns only when it does not exec: 2 on a refused grant or a usage error, 127 when the
    engine's command is not found."""
    parser = build_parser()
    options, command = split_command(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(options)
    if not command:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: no engine command after `--`", file=sys.stderr)
        return 2
    try:
        grant = read_grant(affinity(), args.proc_root, args.cgroup_root)
        topology = read_topology(grant.cpus, args.sys_root)
        binding = plan_binding(grant.cpus, topology, numa_nodes=args.numa_nodes,
                               threads_per_node=args.threads_per_node)
    except BindingRefused as error:
        return refuse(str(error), args.termination_log)
    env = dict(os.environ if environ is None else environ)
    exported = environment(binding)
    replaced = sorted(k for k, v in exported.items() if env.get(k) not in (None, v))
    env.update(exported)
    print(f"{PROG}: {grant.describe()}; binding {binding.describe()}"
          + "".join(f" {k}={v}" for k, v in exported.items()), file=sys.stderr)
    if replaced:
        print(f"{PROG}: replaced the pod's " + ", ".join(replaced) + " with the granted binding",
              file=sys.stderr)
    if binding.unbound:
        print(f"{PROG}: {len(binding.unbound)} granted CPU(s) left unbound: the grant is larger "
              "than the plan (a pod that is not Guaranteed shares the node's pool: its cores are "
              "not exclusive)", file=sys.stderr)
    sys.stderr.flush()
    try:
        execvpe(command[0], command, env)
    except OSError as error:
        print(f"{PROG}: cannot run {command[0]!r}: {error}", file=sys.stderr)
        return 127
    return 0  # only a test's execvpe returns


if __name__ == "__main__":
    sys.exit(main())
