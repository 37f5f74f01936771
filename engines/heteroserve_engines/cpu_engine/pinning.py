"""The CPUs the engine's compute threads are actually pinned to, measured, and reported on
/metrics (`heteroserve:cpu_binding_info`, protocol/binding_report.py).

The compiled pool pins each worker thread to one CPU of the binding as the worker starts, and the
thread that creates the pool to the first (`pin_caller`); a pin the kernel refuses is silent
there. So the report is not the list the engine was given but each compute thread's affinity as
the kernel has it now: the thread that created the pool and the threads that appeared while it
was created (its workers), read with sched_getaffinity at scrape time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..protocol.binding_report import DOCUMENTATION, LABELS, METRIC, ReportedBinding
from .affinity import NODE_ROOT, numa_nodes_of

log = logging.getLogger("heteroserve.cpu_engine")
TASK_DIR = Path("/proc/self/task")


def _tasks(task_dir: Path) -> set[int]:
    try:
        return {int(entry.name) for entry in task_dir.iterdir() if entry.name.isdigit()}
    except OSError:
        return set()


class PinnedThreads:
    """The compute threads of one pool, found by `capture()` around the pool's creation."""

    def __init__(self, task_dir: Path = TASK_DIR, node_root: Path = NODE_ROOT,
                 affinity: Callable[[int], set[int]] = os.sched_getaffinity):
        self.task_dir, self.node_root, self.affinity = task_dir, node_root, affinity
        self.tids: tuple[int, ...] = ()

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Around the pool's creation, in the thread that creates it: no other thread of the
        process may start meanwhile (the engine creates its pool before it starts any)."""
        before = _tasks(self.task_dir)
        yield
        workers = sorted(_tasks(self.task_dir) - before)
        self.tids = (threading.get_native_id(), *workers)

    def measure(self) -> ReportedBinding | None:
        """The union of the compute threads' affinity now; None before `capture` or when no
        thread can be read (a thread that has exited no longer counts)."""
        cpus: set[int] = set()
        alive = 0
        for tid in self.tids:
            try:
                cpus |= set(self.affinity(tid))
            except OSError:
                continue
            alive += 1
        if not alive:
            return None
        nodes = numa_nodes_of(sorted(cpus), self.node_root).values()
        return ReportedBinding.of(cpus, nodes, len(self.tids))


class BindingInfo(Collector):
    """`heteroserve:cpu_binding_info{cpus,numa_nodes,threads} 1`, measured at scrape time (a
    later `taskset` on the process shows up)."""

    def __init__(self, pinned: PinnedThreads):
        self.pinned = pinned

    def collect(self):
        binding = self.pinned.measure()
        family = GaugeMetricFamily(METRIC, DOCUMENTATION, labels=list(LABELS))
        if binding is not None:
            labels = binding.labels()
            family.add_metric([labels[name] for name in LABELS], 1)
        yield family


class PoolParks(Collector):
    """`heteroserve:cpu_pool_parks_total`: the compute threads' waits that ended parked on a
    futex (the pool's `parks`, read at scrape time). A waiting thread spins first, longer while
    no other thread wants its core (threadpool.c), so on cores of its own a pool rarely parks; a
    rate of many a generated token means its hand-offs go through the kernel's wake-ups (a busy
    process on its cores, or a host that steals time from its vCPUs), and decode slows."""

    NAME = "heteroserve:cpu_pool_parks"

    def __init__(self, pool):
        self.pool = pool

    def collect(self):
        family = CounterMetricFamily(
            self.NAME, "Waits of the compute threads that ended parked on a futex (the spin "
            "ran out): many a token means hand-offs through the kernel's wake-ups")
        family.add_metric([], self.pool.parks)
        yield family


def check_pinned(pinned: PinnedThreads, planned: list[int]) -> None:
    """Logs a warning when the threads are not pinned where the binding said (a refused pin)."""
    binding = pinned.measure()
    if binding is not None and set(binding.cpus) != set(planned):
        log.warning("the compute threads run on CPUs %s, not on the binding's %s (a pin the "
                    "kernel refused?); /metrics reports what they run on", binding.cpu_list,
                    planned)
