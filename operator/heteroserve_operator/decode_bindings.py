"""`status.decodeBindings`: the CPUs each decode engine actually bound, as the engine reports them.
Pure: pods and reports in, status entries out; binding_scraper.py does the I/O.

The engine measures its compute threads' affinity and reports it on its /metrics
(`heteroserve:cpu_binding_info`, heteroserve_engines/protocol/binding_report.py); the operator
reads that over the pod's IP, so engine pods keep running without an API token. A running
engine's binding never changes, so it is learned once per engine start: an engine is known by its
pod and its container's `startedAt`, and a restarted container is learned again.

Each decode engine (a decode pod's `engine` container, or the `decode-engine` container of a
sameNode prefill pod) that is scheduled gets one entry:
- `Reported`: the CPUs, their NUMA nodes and the compute threads, as the engine reported them;
- `NotReported`: the engine answered GET /metrics (or 404 for it) without the binding, as engines
  other than heteroserve's CPU engine do (vllm-cpu, sysInfer images);
- `Unknown`: not learned yet (the engine is not ready, or its /metrics could not be read; the
  operator retries with back-off and logs why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from heteroserve_engines.protocol.binding import CpuListError, parse_cpu_list
from heteroserve_engines.protocol.binding_report import ReportedBinding

from .render import same_node
from .render.meta import LABEL_COMPONENT, LABEL_OWNER

FIELD = "decodeBindings"
REPORTED, NOT_REPORTED, UNKNOWN = "Reported", "NotReported", "Unknown"
# The container that runs the decode engine, and its port's name, by the pod's component.
ENGINE_CONTAINERS = {"decode": ("engine", "engine"),
                     "prefill": (same_node.DECODE_CONTAINER, same_node.DECODE_PORT_NAME)}

EngineKey = tuple[str, str, str]   # (namespace, pod, the engine container's startedAt)
OwnerKey = tuple[str, str]         # (namespace, InferenceDeployment)


@dataclass(frozen=True)
class DecodeEngine:
    """One decode engine as its pod shows it."""

    namespace: str
    owner: str
    pod: str
    node: str
    address: str | None      # the pod's IP
    port: int | None         # the engine's containerPort
    started_at: str | None   # the engine container's running.startedAt; None unless running
    ready: bool

    @property
    def key(self) -> EngineKey | None:
        return (self.namespace, self.pod, self.started_at) if self.started_at else None

    @property
    def owner_key(self) -> OwnerKey:
        return self.namespace, self.owner

    def metrics_url(self) -> str | None:
        """Where to read the report: only a running, ready engine with an address."""
        if not (self.ready and self.key and self.address and self.port):
            return None
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"


def decode_engine(pod: Mapping[str, Any]) -> DecodeEngine | None:
    """The decode engine a pod runs; None for a pod that runs none, is not scheduled yet or is
    terminating (it leaves the status as it leaves numaPlans)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    names = ENGINE_CONTAINERS.get(labels.get(LABEL_COMPONENT, ""))
    spec = pod.get("spec") or {}
    if names is None or not labels.get(LABEL_OWNER) or meta.get("deletionTimestamp") \
            or not spec.get("nodeName"):
        return None
    container_name, port_name = names
    container = next((c for c in spec.get("containers") or []
                      if c.get("name") == container_name), None)
    if container is None:
        return None
    port = next((p.get("containerPort") for p in container.get("ports") or []
                 if p.get("name") == port_name), None)
    status = pod.get("status") or {}
    state = next((c for c in status.get("containerStatuses") or []
                  if c.get("name") == container_name), {})
    started = ((state.get("state") or {}).get("running") or {}).get("startedAt")
    return DecodeEngine(meta.get("namespace", ""), labels[LABEL_OWNER], meta.get("name", ""),
                        spec["nodeName"], status.get("podIP") or None, port, started,
                        bool(state.get("ready")))


@dataclass(frozen=True)
class Learned:
    """What one engine start reported: its binding, or None when it reports none."""

    binding: ReportedBinding | None


def entry(engine: DecodeEngine, learned: Learned | None) -> dict[str, Any]:
    """The engine's status entry."""
    base: dict[str, Any] = {"pod": engine.pod, "node": engine.node}
    if learned is None:
        return {**base, "state": UNKNOWN}
    if learned.binding is None:
        return {**base, "state": NOT_REPORTED, "engineStartedAt": engine.started_at}
    binding = learned.binding
    return {**base, "state": REPORTED, "cpus": binding.cpu_list, "threads": binding.threads,
            "numaNodes": list(binding.numa_nodes), "engineStartedAt": engine.started_at}


def entries(engines: Iterable[DecodeEngine], learned: Mapping[EngineKey, Learned]
            ) -> list[dict[str, Any]]:
    """One InferenceDeployment's entries, by pod name."""
    return [entry(e, learned.get(e.key) if e.key else None)
            for e in sorted(engines, key=lambda e: e.pod)]


def adopt(live: list[dict[str, Any]] | None, engine: DecodeEngine) -> Learned | None:
    """What the status already says this engine start reported (written by this operator before
    a restart, or by another replica before a peering hand-over): trusted, so that neither a
    restart nor a hand-over scrapes every engine or writes anything. None when it says nothing
    about this start."""
    if engine.key is None:
        return None
    for item in live or []:
        if item.get("pod") != engine.pod or item.get("engineStartedAt") != engine.started_at:
            continue
        if item.get("state") == NOT_REPORTED:
            return Learned(None)
        if item.get("state") == REPORTED:
            try:
                binding = ReportedBinding.of(parse_cpu_list(str(item.get("cpus", ""))),
                                             [int(n) for n in item.get("numaNodes") or []],
                                             int(item.get("threads", 0)))
            except (CpuListError, TypeError, ValueError):
                return None
            return Learned(binding) if binding.cpus and binding.threads > 0 else None
    return None


def retry_delay(failures: int, first: float, cap: float) -> float:
    """Seconds before the next read of an engine whose /metrics failed `failures` times:
    doubling from `first`, at most `cap`."""
    return min(first * 2 ** max(failures - 1, 0), cap)
