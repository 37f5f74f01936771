"""How a CPU engine reports the CPUs it actually bound: one info-style sample on its /metrics.

    heteroserve:cpu_binding_info{cpus="0-3",numa_nodes="0",threads="4"} 1

`cpus`: the CPUs the engine's compute threads are pinned to, Linux list syntax; `numa_nodes`: the
NUMA nodes of those CPUs, comma-separated; `threads`: the compute threads. The engine measures it
from its own threads' affinity (not from the variables it was given), and the operator reads it
into the InferenceDeployment's status (`decodeBindings`). On /metrics, Prometheus sees the same
fact the operator writes, and the engine needs no API token to tell it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from .binding import CpuListError, format_cpu_list, parse_cpu_list

METRIC = "heteroserve:cpu_binding_info"
LABELS = ("cpus", "numa_nodes", "threads")
DOCUMENTATION = ("The CPUs the engine's compute threads are pinned to (measured from the threads' "
                 "affinity), their NUMA nodes and the number of compute threads; always 1")


class BindingReportError(ValueError):
    """A binding sample that is present but does not parse."""


@dataclass(frozen=True)
class ReportedBinding:
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    threads: int

    @classmethod
    def of(cls, cpus: Iterable[int], numa_nodes: Iterable[int], threads: int
           ) -> ReportedBinding:
        return cls(tuple(sorted(set(cpus))), tuple(sorted(set(numa_nodes))), threads)

    @property
    def cpu_list(self) -> str:
        return format_cpu_list(self.cpus)

    def labels(self) -> dict[str, str]:
        return {"cpus": self.cpu_list, "numa_nodes": ",".join(map(str, self.numa_nodes)),
                "threads": str(self.threads)}


def _from_labels(labels: dict[str, str]) -> ReportedBinding:
    missing = [name for name in LABELS if name not in labels]
    if missing:
        raise BindingReportError(f"{METRIC} lacks the label(s) {', '.join(missing)}")
    try:
        cpus = parse_cpu_list(labels["cpus"])
        nodes = [int(n) for n in labels["numa_nodes"].split(",") if n.strip()]
        threads = int(labels["threads"])
    except (CpuListError, ValueError) as error:
        raise BindingReportError(f"{METRIC}: {error}") from None
    if not cpus or threads < 1 or any(n < 0 for n in nodes):
        raise BindingReportError(f"{METRIC} reports no CPU, a NUMA node below 0 or no thread: "
                                 f"{labels}")
    return ReportedBinding.of(cpus, nodes, threads)


def find_binding(metrics_text: str) -> ReportedBinding | None:
    """The binding in a Prometheus text exposition, or None when it has none (an engine that
    does not report it). Only the binding's own lines are parsed: a foreign engine's /metrics
    may be large and need not parse."""
    prefix = METRIC + "{"
    lines = [line for line in metrics_text.splitlines() if line.startswith(prefix)]
    if not lines:
        return None
    try:
        samples = [s for family in text_string_to_metric_families("\n".join(lines) + "\n")
                   for s in family.samples if s.name == METRIC]
    except ValueError as error:
        raise BindingReportError(f"{METRIC} does not parse: {error}") from None
    if len(samples) != 1:
        raise BindingReportError(f"{METRIC} has {len(samples)} samples; one was expected")
    return _from_labels(dict(samples[0].labels))
