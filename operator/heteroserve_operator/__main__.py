"""`heteroserve-operator`: run the operator (in a pod, or locally against a kubeconfig)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import sys

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client import CollectorRegistry, Counter, start_http_server

from .binding_scraper import BindingScraper
from .kube import KubeApi
from .peering import Peering, PeeringGate, ensure_peering_objects, random_priority
from .reconcile import Reconciler
from .settings import OperatorSettings
from .watches import start_watches
from .workqueue import WorkQueue


def api_client() -> k8s.ApiClient:
    try:
        k8s_config.load_incluster_config()
        return k8s.ApiClient()
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="heteroserve-operator", description=__doc__)
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch only this namespace (repeatable); default: all namespaces")
    parser.add_argument("--resync-seconds", type=float, default=OperatorSettings.resync_seconds)
    parser.add_argument("--metrics-port", type=int, default=OperatorSettings.metrics_port)
    parser.add_argument("--liveness", default=OperatorSettings.liveness_endpoint,
                        help="kopf liveness endpoint URL, or '' for none")
    parser.add_argument("--peering", default=None,
                        help="KopfPeering name for HA (several replicas, one active); "
                        "default: standalone")
    parser.add_argument("--priority", type=int, default=None,
                        help="peering priority (the highest live one acts); default: random, so "
                        "that replicas of one Deployment do not tie (kopf pauses all on a tie)")
    parser.add_argument("--verbose", "-v", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = OperatorSettings(resync_seconds=args.resync_seconds,
                                metrics_port=args.metrics_port,
                                liveness_endpoint=args.liveness or None)
    registry = CollectorRegistry()
    if settings.metrics_port:
        start_http_server(settings.metrics_port, registry=registry)
    kube = KubeApi(api_client(), registry)
    reconciler = Reconciler(kube, registry, facts_ttl_seconds=settings.facts_ttl_seconds)
    peering = None
    if args.peering is not None:
        priority = args.priority if args.priority is not None else random_priority()
        identity = os.environ.get("POD_ID") or \
            f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"
        peering = Peering(args.peering, identity, priority, tuple(args.namespace))
        ensure_peering_objects(kube, peering)
        logging.getLogger(__name__).info("peering %r as %s with priority %d", args.peering,
                                         identity, priority)
    gate = PeeringGate(kube, peering)

    def reconcile_if_active(namespace: str, name: str):
        # A passive replica's informers keep watching; the gate refuses their reconciles and
        # keeps the keys, queued again once this replica may act (handlers._handover).
        if gate.active():
            return reconciler.reconcile_by_name(namespace, name)
        gate.refused(namespace, name)
        return None

    resyncs = Counter("heteroserve_operator_resyncs", "Periodic resyncs; acted=false: skipped "
                      "by a paused peering replica", ["acted"], registry=registry)
    handovers = Counter("heteroserve_operator_handovers", "Times this peering replica took "
                        "over (the replicas that outranked it lapsed or left) and queued every "
                        "InferenceDeployment", registry=registry)
    queue = WorkQueue(reconcile_if_active, settings.workers,
                      settings.min_reconcile_interval_seconds)
    # status.decodeBindings, read from the decode engines' /metrics and written by the
    # reconcile; importing binding_scraper registered its kopf handlers.
    bindings = BindingScraper(kube, gate, registry, request_reconcile=queue.add)
    reconciler.decode_bindings = bindings.entries_for
    from . import handlers  # noqa: F401 - registers the handlers with kopf

    kopf_settings = kopf.OperatorSettings()
    # Set before kopf starts: its first keep-alive already carries the lifetime.
    kopf_settings.peering.lifetime = settings.peering_lifetime_seconds
    kopf.run(
        settings=kopf_settings,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=peering.priority if peering else 0,
        identity=peering.identity if peering else None,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(reconciler=reconciler, queue=queue, settings=settings, gate=gate,
                       resyncs=resyncs, handovers=handovers, bindings=bindings,
                       start_watches=lambda loop: start_watches(
                           reconciler, queue, bindings, loop, tuple(args.namespace),
                           settings.watch_timeout_seconds)),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
