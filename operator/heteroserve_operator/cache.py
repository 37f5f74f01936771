"""The latest copies of watched objects, fed by the watches kopf already runs (an informer).

Reconciles read from here instead of the API server; any decision to write is confirmed against a
live read first (reconcile.py), so a cache that lags — at start-up, or behind the operator's own
writes — costs a read, never a wrong or needless write.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

Key = tuple[str, str, str]  # (kind, namespace, name)


class ObjectCache:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}

    @staticmethod
    def _key(kind: str, body: dict[str, Any]) -> Key:
        meta = body["metadata"]
        return kind, meta.get("namespace", ""), meta["name"]

    def upsert(self, kind: str, body: dict[str, Any]) -> None:
        key = self._key(kind, body)
        with self._lock:
            current = self._objects.get(key)
            # Never step back to an older copy (a watch event behind the operator's own write).
            if current is not None and _older(body, current):
                return
            self._objects[key] = body

    def delete(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.pop((kind, namespace, name), None)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((kind, namespace, name))

    def select(self, kind: str, namespace: str, labels: dict[str, str],
               keep: Callable[[dict[str, Any]], bool] = lambda _o: True) -> list[dict[str, Any]]:
        with self._lock:
            items = [o for (k, ns, _n), o in self._objects.items() if k == kind and ns == namespace]
        return [o for o in items
                if all((o["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items())
                and keep(o)]


def _older(candidate: dict[str, Any], current: dict[str, Any]) -> bool:
    try:
        return int(candidate["metadata"]["resourceVersion"]) < int(
            current["metadata"]["resourceVersion"])
    except (KeyError, ValueError):
        return False
