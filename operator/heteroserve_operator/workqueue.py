"""A deduplicating work queue between the operator's watches and the reconciler.

Watches fire in bursts (a Deployment's status, its pods, its EndpointSlices all change within a
second); the queue collapses every trigger for one InferenceDeployment that arrives while it is
waiting or being reconciled into one more reconcile, as controller-runtime's workqueue does, and
reconciles one key at most once per `min_interval` seconds so that a burst costs one or two
reconciles rather than one per event. A key is never reconciled by two workers at once.

The structure is client-go's: keys that may run now wait in a first-in, first-out queue; keys
held back by `min_interval` wait in a heap by the time they may run; a key triggered while a
worker reconciles it is marked dirty and queued again when that reconcile ends. Taking and
adding a key cost O(log n) and wake one worker, whatever the number of keys waiting: the
earlier version scanned every waiting key on each take and woke every worker on each finished
reconcile, about a millisecond of CPU per reconcile with a thousand keys waiting
(tests/bench/workqueue_cpu.py measures it; docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    def __init__(self, work: Callable[[str, str], object], workers: int,
                 min_interval: float = 0.0):
        self._work = work
        self._min_interval = min_interval
        self._last: dict[Key, float] = {}    # when each key's last reconcile ended
        self._cond = threading.Condition()
        self._queued: set[Key] = set()       # waiting, in _ready or in _delayed
        self._ready: deque[Key] = deque()    # may run now, first in first out
        self._delayed: list[tuple[float, int, Key]] = []   # (may run at, order, key)
        self._order = itertools.count()
        self._active: set[Key] = set()       # being reconciled
        self._dirty: set[Key] = set()        # triggered while being reconciled
        # The time the one worker waiting for the earliest held-back key waits until (None:
        # no such worker); the others wait for a notification, so that a key's time coming
        # wakes one worker, not all.
        self._timer_until: float | None = None
        self._stopped = False
        self._threads = [threading.Thread(target=self._run, name=f"reconcile-{i}", daemon=True)
                         for i in range(workers)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def add(self, namespace: str, name: str) -> None:
        with self._cond:
            self._add((namespace, name))

    def add_unless_recent(self, namespace: str, name: str, within: float) -> bool:
        """Queues the key unless it is queued or running already, or finished a reconcile less
        than `within` seconds ago; True when queued. For the periodic resync: an object
        reconciled moments ago has just been read afresh, and a thousand redundant reconciles
        would compete with those that matter."""
        key = (namespace, name)
        with self._cond:
            if key in self._queued or key in self._active:
                return False
            if time.monotonic() - self._last.get(key, float("-inf")) < within:
                return False
            self._add(key)
            return True

    def __len__(self) -> int:
        """Keys waiting (ready or held back), not those being reconciled."""
        with self._cond:
            return len(self._queued)

    def _add(self, key: Key) -> None:
        """With the lock held."""
        if key in self._queued:
            return
        if key in self._active:
            self._dirty.add(key)
            return
        self._queued.add(key)
        ready_at = self._last.get(key, float("-inf")) + self._min_interval
        if ready_at <= time.monotonic():
            self._ready.append(key)
            self._cond.notify()
            return
        heapq.heappush(self._delayed, (ready_at, next(self._order), key))
        if self._timer_until is None or ready_at < self._timer_until:
            self._cond.notify()   # a worker to wait for this key's time

    def _next(self) -> Key | None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    self._ready.append(heapq.heappop(self._delayed)[2])
                if self._ready:
                    key = self._ready.popleft()
                    self._queued.discard(key)
                    self._active.add(key)
                    if self._ready or (self._delayed and self._timer_until is None):
                        self._cond.notify()   # more work, or a time to wait for: pass it on
                    return key
                if self._delayed and (self._timer_until is None
                                      or self._delayed[0][0] < self._timer_until):
                    until = self._timer_until = self._delayed[0][0]
                    self._cond.wait(until - now)
                    if self._timer_until == until:
                        self._timer_until = None
                else:
                    self._cond.wait()
            return None

    def _run(self) -> None:
        while (key := self._next()) is not None:
            try:
                self._work(*key)
            except Exception:
                log.exception("reconcile of %s/%s failed; the next trigger or resync retries",
                              *key)
            finally:
                with self._cond:
                    self._active.discard(key)
                    now = time.monotonic()
                    self._last[key] = now
                    if key in self._dirty:
                        self._dirty.discard(key)
                        self._add(key)
                    if len(self._last) > 4 * (len(self._queued) + 1024):
                        horizon = now - self._min_interval
                        self._last = {k: t for k, t in self._last.items() if t > horizon}
