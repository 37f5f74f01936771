"""The seeds' CPU-binding environment variables and the CPU-list syntax they use."""

from __future__ import annotations

from collections.abc import Iterable

# sysHAX: the fused CPU path; OMP_NUM_THREADS only counts with it.
INFERENCE_OP_MODE = "INFERENCE_OP_MODE"
# Threads of the CPU engine; equals the number of bound CPUs (both seeds' rule).
OMP_NUM_THREADS = "OMP_NUM_THREADS"
# sysHAX: the bound CPUs, Linux list syntax with an optional ":step" ("0-30:2,64").
CUSTOM_CPU_AFFINITY = "CUSTOM_CPU_AFFINITY"
# sysInfer (libgomp): the bound CPUs.
GOMP_CPU_AFFINITY = "GOMP_CPU_AFFINITY"
# sysHAX: requantize the weights on load (q8_0 | q4_0).
SYSHAX_QUANTIZE = "SYSHAX_QUANTIZE"
# sysHAX: weight rows per one-token GEMV (1 | 2 | 4).
NRC = "NRC"

# The variables that carry the binding: whoever plans the CPUs owns them.
BINDING_VARIABLES = (OMP_NUM_THREADS, CUSTOM_CPU_AFFINITY, GOMP_CPU_AFFINITY)


class CpuListError(ValueError):
    """A CPU list that does not parse."""


def parse_cpu_list(text: str) -> list[int]:
    """"0-3,8,10-20:2" -> [0, 1, 2, 3, 8, 10, 12, ..., 20] in the order written (Linux list
    syntax plus sysHAX's step). A CPU named twice is an error."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.replace(" ", ",").split(","))):
        span, _, step = part.partition(":")
        low, _, high = span.partition("-")
        try:
            first, last, stride = int(low), int(high or low), int(step or 1)
        except ValueError:
            raise CpuListError(f"invalid CPU list element {part!r} in {text!r}") from None
        if first < 0 or last < first or stride < 1:
            raise CpuListError(f"invalid CPU list element {part!r} in {text!r}")
        cpus.extend(range(first, last + 1, stride))
    if len(set(cpus)) != len(cpus):
        raise CpuListError(f"CPU list {text!r} names a CPU twice")
    return cpus


def format_cpu_list(cpus: Iterable[int]) -> str:
    """CPU ids -> compact sorted Linux CPU list ("0-29,40-69")."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        ranges.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(ranges)
