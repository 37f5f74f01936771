"""kopf wiring: every trigger runs the same reconcile.

State-driven, not event-driven: the InferenceDeployment's own watch events, its children's
events, EndpointSlice changes of its Service, and a periodic resync all call
`Reconciler.reconcile` through a deduplicating work queue. No kopf progress storage or
finalizers are used, so an idle operator writes
nothing. The Reconciler arrives through kopf's `memo` (built in __main__).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from .api.models import GROUP, PLURAL, VERSION
from .render.meta import LABEL_OWNER, MANAGED_BY

log = logging.getLogger(__name__)
CHILD_LABELS = {**MANAGED_BY, LABEL_OWNER: kopf.PRESENT}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # kopf's per-handler success events would be writes on every reconcile; the reconciler
    # posts Events for condition transitions itself.
    settings.posting.enabled = False
    # One log line per watch event is noise at scale; reconciles log what they change.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = memo.settings.watch_timeout_seconds
    settings.watching.client_timeout = memo.settings.watch_timeout_seconds + 30
    memo.queue.start()
    memo.resync_task = asyncio.create_task(_resync(memo))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    task = getattr(memo, "resync_task", None)
    if task:
        task.cancel()
    memo.queue.stop()


async def _resync(memo: kopf.Memo) -> None:
    """Level-triggered safety net: reconcile everything every `resync_seconds`."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(memo.settings.resync_seconds)
        try:
            # A paused peer (kopf's watches stopped, another replica acts) resyncs nothing.
            if not await loop.run_in_executor(None, memo.gate.active):
                memo.resyncs.labels("false").inc()
                continue
            items = await loop.run_in_executor(None, memo.reconciler.kube.list_all_owners)
            for namespace, name in items:
                memo.queue.add(namespace, name)
            memo.resyncs.labels("true").inc()
        except Exception:
            log.exception("periodic resync failed; retrying at the next interval")


@kopf.on.event(GROUP, VERSION, PLURAL)
async def inference_deployment_changed(body: kopf.Body, event: dict, memo: kopf.Memo,
                                       **_) -> None:
    if event.get("type") == "DELETED" or body.metadata.get("deletionTimestamp"):
        return  # owner references let the garbage collector remove the children
    memo.queue.add(body.metadata.namespace, body.metadata.name)


@kopf.on.event("discovery.k8s.io", "v1", "endpointslices", labels=CHILD_LABELS)
@kopf.on.event("apps", "v1", "deployments", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "services", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "configmaps", labels=CHILD_LABELS)
@kopf.on.event("", "v1", "pods", labels={LABEL_OWNER: kopf.PRESENT})
async def child_changed(body: kopf.Body, memo: kopf.Memo, **_) -> None:
    # EndpointSlices carry their Service's labels, so a router endpoint turning ready updates
    # RouterReady without waiting for the resync. Pods of both tiers: a prefill (or same-node)
    # pod that cannot be scheduled or keeps crashing is in the status at once too.
    owner = body.metadata.labels.get(LABEL_OWNER)
    if owner:
        memo.queue.add(body.metadata.namespace, owner)
