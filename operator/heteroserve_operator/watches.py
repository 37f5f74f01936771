"""The operator's watches (informer.py): of the InferenceDeployments and of their children, and
what their events do."""

from __future__ import annotations

import asyncio
from typing import Any

from .api.models import GROUP, KIND, PLURAL, VERSION
from .binding_scraper import BindingScraper
from .informer import ChildCaches, Event, Informer, WatchSpec
from .reconcile import Reconciler
from .render.meta import LABEL_COMPONENT, LABEL_OWNER, MANAGED_BY
from .workqueue import WorkQueue

# The watched children (informer.py), filtered by the apiserver. Only what the reconciler reads
# is watched whole: Deployments (their status), the router Service's EndpointSlices (RouterReady
# counts their ready endpoints; the headless decode Service's slices change as decode pods turn
# ready, which the Deployments' own events report), and the pods of the prefill and decode tiers
# (why a tier is not ready; the binding scraper's engines). Of the others the reconciler needs
# to know only that they exist and what version it last wrote: metadata only. The router's pods
# are not watched: its Deployment's status and EndpointSlices say what the status shows of them.
CHILD_SELECTOR = ",".join([*(f"{k}={v}" for k, v in MANAGED_BY.items()), LABEL_OWNER])
CHILD_WATCHES = (
    WatchSpec("ConfigMap", "v1", "configmaps", CHILD_SELECTOR, metadata_only=True),
    WatchSpec("Service", "v1", "services", CHILD_SELECTOR, metadata_only=True),
    WatchSpec("Deployment", "apps/v1", "deployments", CHILD_SELECTOR, metadata_only=False),
    WatchSpec("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets", CHILD_SELECTOR,
              metadata_only=True),
    WatchSpec("Ingress", "networking.k8s.io/v1", "ingresses", CHILD_SELECTOR,
              metadata_only=True),
    WatchSpec("EndpointSlice", "discovery.k8s.io/v1", "endpointslices",
              f"{CHILD_SELECTOR},{LABEL_COMPONENT}=router", metadata_only=False),
    WatchSpec("Pod", "v1", "pods", f"{LABEL_OWNER},{LABEL_COMPONENT} in (prefill,decode)",
              metadata_only=False),
)

SELECTORS = {spec.kind: spec.selector for spec in CHILD_WATCHES}


def child_event(reconciler: Reconciler, queue: WorkQueue) -> Event:
    """Every child kind is watched, so a child deleted or edited by hand is repaired at once
    rather than at the resync. EndpointSlices carry their Service's labels, so a router
    endpoint turning ready updates RouterReady without waiting for the resync. Pods of both
    tiers: a prefill (or same-node) pod that cannot be scheduled or keeps crashing is in the
    status at once too."""

    def on_event(event_type: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        owner = (meta.get("labels") or {}).get(LABEL_OWNER)
        if not owner:
            return
        kind, namespace, name = obj["kind"], meta.get("namespace", ""), meta["name"]
        version = meta.get("resourceVersion")
        if event_type == "DELETED":
            reconciler.forget(kind, namespace, name)
            reconciler.saw(kind, namespace, name, None)
        else:
            reconciler.saw(kind, namespace, name, version)
            if reconciler.is_own_write(kind, namespace, name, version):
                return
        queue.add(namespace, owner)

    return on_event


def pod_event(children: Event, bindings: BindingScraper, loop: asyncio.AbstractEventLoop
              ) -> Event:
    """A pod's event: the reconcile's trigger, and the binding scraper's engine index (which
    lives on kopf's event loop)."""

    def on_event(event_type: str, obj: dict[str, Any]) -> None:
        children(event_type, obj)
        loop.call_soon_threadsafe(bindings.pod_event, obj, event_type)

    return on_event


# The InferenceDeployments, whole: kept in the reconciler's store (`Reconciler.owners`), which its
# own status writes also update.
OWNER_WATCH = WatchSpec(KIND, f"{GROUP}/{VERSION}", PLURAL, "", metadata_only=False)


def owner_event(reconciler: Reconciler, queue: WorkQueue, bindings: BindingScraper,
                loop: asyncio.AbstractEventLoop) -> Event:
    """An InferenceDeployment's event (the informer has already stored or removed it)."""

    def on_event(event_type: str, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        namespace, name = meta.get("namespace", ""), meta["name"]
        loop.call_soon_threadsafe(bindings.owner_event, body, event_type)
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            reconciler.forget(KIND, namespace, name)
            return  # owner references let the garbage collector remove the children
        # An echo of this operator's own status write (its reconciles are the one writer of
        # the status) needs no reconcile, unless the spec moved past what the status observed:
        # after a watch reconnect, the one event delivered for an object may be a write that
        # followed an edit.
        if reconciler.is_own_write(KIND, namespace, name, meta.get("resourceVersion")) \
                and meta.get("generation") == (body.get("status") or {}).get(
                    "observedGeneration"):
            return
        queue.add(namespace, name)

    return on_event


class Watches:
    """The running informers: the InferenceDeployments' (one per namespace, or one) and the
    children's caches."""

    def __init__(self, owners: list[Informer], caches: ChildCaches):
        self.owners, self.caches = owners, caches

    def start(self) -> None:
        self.caches.start()
        for informer in self.owners:
            informer.start()

    def stop(self) -> None:
        self.caches.stop()
        for informer in self.owners:
            informer.stop()


def start_watches(reconciler: Reconciler, queue: WorkQueue, bindings: BindingScraper,
                  loop: asyncio.AbstractEventLoop, namespaces: tuple[str, ...],
                  timeout_seconds: int) -> Watches:
    """Starts the informers and hands their caches to the reconciler and the scraper."""
    children = child_event(reconciler, queue)
    handlers: dict[str, Event] = {spec.kind: children for spec in CHILD_WATCHES}
    handlers["Pod"] = pod_event(children, bindings, loop)
    caches = ChildCaches(reconciler.kube, CHILD_WATCHES, handlers, namespaces, timeout_seconds)
    owners = [Informer(reconciler.kube, OWNER_WATCH,
                       owner_event(reconciler, queue, bindings, loop), namespace,
                       timeout_seconds, store=reconciler.owners)
              for namespace in (namespaces or (None,))]
    reconciler.caches = bindings.caches = caches
    watches = Watches(owners, caches)
    watches.start()
    return watches
