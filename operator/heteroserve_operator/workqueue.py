"""A deduplicating work queue between kopf's watch handlers and the reconciler.

Watches fire in bursts (a Deployment's status, its pods, its EndpointSlices all change within a
second); the queue collapses every trigger for one InferenceDeployment that arrives while it is
waiting or being reconciled into one more reconcile, as controller-runtime's workqueue does, and
reconciles one key at most once per `min_interval` seconds so that a burst costs one or two
reconciles rather than one per event. A key is never reconciled by two workers at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    def __init__(self, work: Callable[[str, str], object], workers: int,
                 min_interval: float = 0.0):
        self._work = work
        self._min_interval = min_interval
        self._last: dict[Key, float] = {}
        self._cond = threading.Condition()
        self._pending: dict[Key, None] = {}   # insertion-ordered set
        self._active: set[Key] = set()
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
            self._pending[(namespace, name)] = None
            self._cond.notify()

    def add_unless_recent(self, namespace: str, name: str, within: float) -> bool:
        """Queues the key unless it is queued or running already, or finished a reconcile less
        than `within` seconds ago; True when queued. For the periodic resync: an object
        reconciled moments ago has just been read afresh, and a thousand redundant reconciles
        would compete with those that matter."""
        key = (namespace, name)
        with self._cond:
            if key in self._pending or key in self._active:
                return False
            if time.monotonic() - self._last.get(key, float("-inf")) < within:
                return False
            self._pending[key] = None
            self._cond.notify()
            return True

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)

    def _next(self) -> Key | None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                wait: float | None = None
                for key in self._pending:
                    if key in self._active:
                        continue
                    ready_at = self._last.get(key, 0.0) + self._min_interval
                    if ready_at <= now:
                        del self._pending[key]
                        self._active.add(key)
                        return key
                    wait = ready_at - now if wait is None else min(wait, ready_at - now)
                self._cond.wait(wait)
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
                    self._last[key] = time.monotonic()
                    if len(self._last) > 4 * (len(self._pending) + 1024):
                        horizon = time.monotonic() - self._min_interval
                        self._last = {k: t for k, t in self._last.items() if t > horizon}
                    self._cond.notify_all()
