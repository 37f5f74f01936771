"""kopf wiring: the operator's lifecycle (start-up, clean-up), peering and liveness, the
periodic resync and, with peering, the hand-over.

State-driven, not event-driven: the InferenceDeployments' and their children's watch events (the
operator's own informers, informer.py and watches.py) and a periodic resync all call
`Reconciler.reconcile` through a deduplicating work queue. No kopf progress storage or
finalizers are used, so an idle operator writes nothing. The Reconciler arrives through kopf's
`memo` (built in __main__).

kopf's resource watches are not used: its per-event machinery (Body wrapping, cause detection,
handler matching and invocation) was most of the operator's CPU at a thousand objects
(docs/benchmarks.md, operator scale).
"""

from __future__ import annotations

import asyncio
import logging

import kopf

log = logging.getLogger(__name__)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # kopf's per-handler success events would be writes on every reconcile; the reconciler
    # posts Events for condition transitions itself.
    settings.posting.enabled = False
    memo.queue.start()
    # The informers (watches.py, built in __main__); the binding scraper's pod and
    # InferenceDeployment events come back to this loop.
    memo.watches = memo.start_watches(asyncio.get_running_loop())
    memo.resync_task = asyncio.create_task(_resync(memo))
    memo.handover_task = (asyncio.create_task(_handover(memo))
                          if memo.gate.peering is not None else None)


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_) -> None:
    for name in ("resync_task", "handover_task"):
        task = getattr(memo, name, None)
        if task:
            task.cancel()
    watches = getattr(memo, "watches", None)
    if watches is not None:
        watches.stop()
    memo.queue.stop()


async def _resync(memo: kopf.Memo) -> None:
    """Level-triggered safety net: reconcile everything every `resync_seconds` (objects that
    a watch event had reconciled in the last half period are left out of that round)."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(memo.settings.resync_seconds)
        try:
            # A paused peer (another replica acts) resyncs nothing.
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


async def _handover(memo: kopf.Memo) -> None:
    """With peering: a passive replica looks again just after the keep-alives that outranked it
    would lapse, and on taking over queues every InferenceDeployment. The events it let pass
    while passive were dropped by the gate, and the periodic resync may be minutes away, so
    without this a replica killed without notice would be replaced only at the next resync.
    An active replica looks every half lifetime, to notice a pause (a replica of higher
    priority joined) and so take over again later."""
    loop = asyncio.get_running_loop()
    gate, half = memo.gate, memo.settings.peering_lifetime_seconds / 2
    active = await loop.run_in_executor(None, gate.active)
    while True:
        if active:
            wait = half
        else:
            # 0.25 s after the lapse (kopf's clock and ours may differ by a little); with no
            # lapse known (the peering object was unreadable, or the listing below failed) in
            # 2 s.
            lapse = gate.lapse_in()
            wait = min(half, 2.0 if lapse is None else lapse + 0.25)
        await asyncio.sleep(wait)
        try:
            now_active = await loop.run_in_executor(None, lambda: gate.active(fresh=True))
            if now_active and not active:
                items = await loop.run_in_executor(None, memo.reconciler.kube.list_all_owners)
                for namespace, name in items:
                    memo.queue.add(namespace, name)
                memo.handovers.inc()
                log.info("peering: taking over; %d InferenceDeployment(s) queued", len(items))
            active = now_active   # not reached when the listing failed: taken over next time
        except Exception:
            log.exception("peering hand-over check failed; looking again shortly")
