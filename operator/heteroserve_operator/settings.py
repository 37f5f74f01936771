"""Operator settings: typed, with units and the reason for each default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSettings:
    # Seconds between full resyncs of every InferenceDeployment. Watches carry every change;
    # the resync only repairs what a lost event or a failed write left behind.
    resync_seconds: float = 300.0
    # Seconds a watch request stays open before kopf re-establishes it.
    watch_timeout_seconds: int = 300
    # Reconcile worker threads. A reconcile spends nearly all its time waiting for the apiserver
    # (a few blocking calls in a row), so the workers, not the operator's CPU, bound how many
    # objects converge at once: with 8, a thousand new objects waited behind each other's
    # round trips while the control plane had CPU to spare (docs/benchmarks.md, operator scale).
    workers: int = 32
    # Seconds between two reconciles of one InferenceDeployment: a burst of child events
    # (Deployment status, pods, EndpointSlices) is served by one or two reconciles.
    min_reconcile_interval_seconds: float = 1.0
    # Seconds a listing of nodes and NodeResourceTopologies is reused across reconciles.
    facts_ttl_seconds: float = 10.0
    # Port of the Prometheus /metrics endpoint (0: none).
    metrics_port: int = 8080
    # Seconds a replica's keep-alive in the peering object counts (kopf's default is 60). A
    # replica killed without notice is presumed dead this long after its last keep-alive, so
    # this bounds the hand-over; keep-alives are sent every lifetime minus 5..10 s.
    peering_lifetime_seconds: int = 20
    # host:port of kopf's liveness endpoint (/healthz), or None.
    liveness_endpoint: str | None = "http://0.0.0.0:8081/healthz"
