"""`heteroserve-operator`: run the operator (in a pod, or locally against a kubeconfig)."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from prometheus_client import CollectorRegistry, start_http_server

from .kube import KubeApi
from .reconcile import Reconciler
from .settings import OperatorSettings
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
    parser.add_argument("--priority", type=int, default=0, help="peering priority")
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
    reconciler = Reconciler(KubeApi(api_client(), registry), registry,
                            facts_ttl_seconds=settings.facts_ttl_seconds)
    queue = WorkQueue(reconciler.reconcile_by_name, settings.workers,
                      settings.min_reconcile_interval_seconds)
    from . import handlers  # noqa: F401 - registers the handlers with kopf

    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=args.priority,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(reconciler=reconciler, queue=queue, settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
