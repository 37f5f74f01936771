"""kopf wiring: every trigger runs the same reconcile.

State-driven, not event-driven: the InferenceDeployment's own watch events (kopf's), its
children's events (the operator's own informers, informer.py), EndpointSlice changes of its
Service, and a periodic resync all call `Reconciler.reconcile` through a deduplicating work
queue. No kopf progress storage or
finalizers are used, so an idle operator writes
nothing. The Reconciler arrives through kopf's `memo` (built in __main__).

A watch event that only echoes the operator's own last write of that object (its status patch,
a child's apply: the same resourceVersion) queues nothing: the reconcile that wrote it saw
everything the event carries. Every other event, deletions included, queues a reconcile.
"""

from __future__ import annotations

import asyncio
import logging

import kopf

from .api.models import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)


class EventOnlyDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a deep copy of every watched object on every event (its "essence") to find
    what changed for on.create/on.update handlers and daemons. This operator registers only
    on.event handlers, which never see it; the copies were a fifth of the operator's CPU while
    a thousand objects converged (docs/benchmarks.md, operator scale)."""

    def build(self, *, body: kopf.Body, extra_fields=None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def only_event_handlers(registry: kopf.OperatorRegistry) -> bool:
    return not (registry._changing.get_all_handlers() or registry._spawning.get_all_handlers())


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    if only_event_handlers(kopf.get_default_registry()):
        settings.persistence.diffbase_storage = EventOnlyDiffBase()
    # kopf's per-handler success events would be writes on every reconcile; the reconciler
    # posts Events for condition transitions itself.
    settings.posting.enabled = False
    # One log line per watch event is noise at scale; reconciles log what they change.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = memo.settings.watch_timeout_seconds
    settings.watching.client_timeout = memo.settings.watch_timeout_seconds + 30
    memo.queue.start()
    # The children's informers (watches.py, built in __main__); the binding scraper's pod
    # events come back to this loop.
    memo.caches = memo.start_watches(asyncio.get_running_loop())
    memo.resync_task = asyncio.create_task(_resync(memo))


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    task = getattr(memo, "resync_task", None)
    if task:
        task.cancel()
    caches = getattr(memo, "caches", None)
    if caches is not None:
        caches.stop()
    memo.queue.stop()


async def _resync(memo: kopf.Memo) -> None:
    """Level-triggered safety net: reconcile everything every `resync_seconds` (objects that
    a watch event had reconciled in the last half period are left out of that round)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(memo.settings.resync_seconds)
        try:
            # A paused peer (kopf's watches stopped, another replica acts) resyncs nothing.
            if not await loop.run_in_executor(None, memo.gate.active):
                memo.resyncs.labels("false").inc()
                continue
            items = await loop.run_in_executor(None, memo.reconciler.kube.list_all_owners)
            # An object reconciled within the last half period is not queued again, so every
            # object is still reconciled at least once every 1.5 periods.
            for namespace, name in items:
                if memo.queue.add_unless_recent(namespace, name,
                                                memo.settings.resync_seconds / 2):
                    memo.reconciler.read_all_next(namespace, name)
            memo.resyncs.labels("true").inc()
        except Exception:
            log.exception("periodic resync failed; retrying at the next interval")


@kopf.on.event(GROUP, VERSION, PLURAL)
async def inference_deployment_changed(body: kopf.Body, event: dict, memo: kopf.Memo,
                                       **_) -> None:
    namespace, name = body.metadata.namespace, body.metadata.name
    deleted = event.get("type") == "DELETED"
    memo.reconciler.saw_owner(event.get("object") or dict(body), deleted)
    if deleted or body.metadata.get("deletionTimestamp"):
        memo.reconciler.forget(KIND, namespace, name)
        return  # owner references let the garbage collector remove the children
    # An echo of this operator's own status write (a reconcile's, or the binding scraper's) needs
    # no reconcile, unless the spec moved past what the status observed: after a watch
    # reconnect, the one event delivered for an object may be a write that followed an edit.
    if memo.reconciler.is_own_write(KIND, namespace, name, body.metadata.get("resourceVersion")) \
            and body.metadata.get("generation") == (body.get("status") or {}).get(
                "observedGeneration"):
        return
    memo.queue.add(namespace, name)
