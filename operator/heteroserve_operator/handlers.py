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
import contextlib
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
    memo.resync_task = asyncio.create_task(_resync(memo), name="resync")
    memo.resync_task.add_done_callback(_report_end)
    memo.handover_task = None
    if memo.gate.peering is not None:
        memo.handover_task = asyncio.create_task(_handover(memo), name="peering hand-over")
        memo.handover_task.add_done_callback(_report_end)


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
    """With peering: acting again once this replica may. The gate refuses a passive replica's
    reconciles (its informers keep watching), and the periodic resync may be minutes away, so
    without this a replica killed without notice would be replaced only at the next resync.

    A passive replica looks again 0.25 s after the keep-alives that outrank it would lapse (a
    renewed one sends it back to wait; 0.25 s: a read that lands just before the deadline
    still finds the peer live). On taking over (the gate's `takeovers` moved, whoever read
    it) it queues every InferenceDeployment; otherwise it queues what the gate refused while
    its object was unreadable. An active replica looks every half lifetime, and the gate
    wakes it at once when a read by anyone finds something to act on."""
    loop = asyncio.get_running_loop()
    gate, half = memo.gate, memo.settings.peering_lifetime_seconds / 2
    wake = asyncio.Event()
    gate.on_change = lambda: loop.call_soon_threadsafe(wake.set)
    seen = 0   # the gate's take-overs acted on
    active, retry = await loop.run_in_executor(None, gate.active), False
    try:
        while True:
            if active and not retry:
                wait = half
            else:
                # With no lapse known (the peering object was unreadable, or the listing
                # below failed): in 2 s.
                lapse = None if active else gate.lapse_in()
                wait = min(half, 2.0 if lapse is None else lapse + 0.25)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
            try:
                active = await loop.run_in_executor(None, lambda: gate.active(fresh=True))
                wake.clear()   # this read's own wake-up, or one that what follows acts on
                if not active:
                    continue
                takeovers = gate.takeovers
                if takeovers != seen:
                    items = await loop.run_in_executor(None,
                                                       memo.reconciler.kube.list_all_owners)
                    # Every key, and any refused since the listing (an object created since).
                    for namespace, name in dict.fromkeys([*items, *gate.take_refused()]):
                        memo.queue.add(namespace, name)
                    memo.handovers.inc(takeovers - seen)
                    seen = takeovers
                    log.info("peering: taking over; %d InferenceDeployment(s) queued",
                             len(items))
                else:
                    for namespace, name in gate.take_refused():
                        memo.queue.add(namespace, name)
                retry = False
            except Exception:
                retry = True
                log.exception("peering hand-over check failed; looking again in 2 s")
    finally:
        gate.on_change = None


def _report_end(task: asyncio.Task) -> None:
    """A background task that ended other than by cancellation is a bug: said, not silent."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s ended: %r", task.get_name(), task.exception(),
                  exc_info=task.exception())
