"""Which replica acts when several run with kopf peering (high availability).

kopf keeps a peering object whose status lists every replica (identity -> priority, lifetime,
lastseen) and pauses its watches in every replica but the one of the highest priority; while two
live replicas share the top priority it pauses all of them. The operator's own periodic resync
and its work queue run outside kopf's handlers, so they ask the same question of the same object
before acting (`PeeringGate.active`). A replica killed without notice stays listed until its
`lastseen + lifetime` passes; then the next one takes over: it looks again the moment the
keep-alives that outranked it would lapse (`PeeringGate.lapse_in`), and queues every
InferenceDeployment (handlers.py), since the events it let pass while passive were not acted on.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .kube import ApiError, KubeApi

log = logging.getLogger(__name__)

GROUP, VERSION = "kopf.dev", "v1"
CLUSTER_PLURAL, NAMESPACED_PLURAL = "clusterkopfpeerings", "kopfpeerings"


def random_priority() -> int:
    """A priority for a replica started without one: replicas of one Deployment share their
    arguments, and kopf pauses every replica when two live ones share the top priority."""
    return 1 + secrets.randbelow(2**31 - 2)


def _parse_time(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def outranked_until(peers: dict[str, Any], identity: str, priority: int, now: dt.datetime
                    ) -> dt.datetime | None:
    """kopf's rule: another live peer (lastseen + lifetime still ahead) with a priority at
    least ours pauses us. Returns when the last such keep-alive lapses (unless renewed), or
    None when no live peer outranks us."""
    until = None
    for other, info in (peers or {}).items():
        if other == identity or not isinstance(info, dict) or "lastseen" not in info:
            continue
        deadline = _parse_time(info["lastseen"]) + dt.timedelta(
            seconds=int(info.get("lifetime", 60)))
        if deadline > now and int(info.get("priority", 0)) >= priority:
            until = deadline if until is None else max(until, deadline)
    return until


@dataclass(frozen=True)
class Peering:
    name: str
    identity: str
    priority: int
    # Watched namespaces; empty: cluster-wide (a ClusterKopfPeering).
    namespaces: tuple[str, ...] = ()

    def paths(self) -> list[str]:
        if not self.namespaces:
            return [f"/apis/{GROUP}/{VERSION}/{CLUSTER_PLURAL}/{self.name}"]
        return [f"/apis/{GROUP}/{VERSION}/namespaces/{ns}/{NAMESPACED_PLURAL}/{self.name}"
                for ns in self.namespaces]


def ensure_peering_objects(kube: KubeApi, peering: Peering) -> None:
    """Creates the peering object(s) kopf keeps its keep-alives in (kopf patches them, never
    creates them); an existing one is left as it is."""
    for path in peering.paths():
        collection, _, name = path.rpartition("/")
        kind = "ClusterKopfPeering" if not peering.namespaces else "KopfPeering"
        meta: dict[str, Any] = {"name": name}
        if peering.namespaces:
            meta["namespace"] = collection.split("/namespaces/")[1].split("/")[0]
        try:
            kube.request("POST", collection, body={"apiVersion": f"{GROUP}/{VERSION}",
                                                   "kind": kind, "metadata": meta})
        except ApiError as error:
            if error.status != 409:
                raise


class PeeringGate:
    """`active()`: whether this replica may act now; None peering: always. The answer is read
    from the apiserver at most once per `ttl` seconds (`fresh=True`: now); an unreadable
    peering object means: do not act.

    The gate also keeps what acting again needs, whoever read it (a reconcile, the resync or
    the hand-over task): `takeovers` counts the reads that found this replica free to act
    after one that found it outranked; `refused()` records the keys whose reconciles it
    refused, `take_refused()` hands them over. `on_change`, when set (by handlers._handover),
    is called from the reading thread when a read finds the replica free to act and either
    is there to act on."""

    def __init__(self, kube: KubeApi, peering: Peering | None, ttl: float = 1.0):
        self.kube, self.peering, self.ttl = kube, peering, ttl
        self._lock = threading.Lock()
        self._answer, self._at = False, -float("inf")
        # The last successful read's answer (None: none yet); a failed read leaves it.
        self._known: bool | None = None
        # When the keep-alives that outranked this replica at the last read lapse (None: none
        # did, or the object could not be read).
        self._until: dt.datetime | None = None
        self._refused: set[tuple[str, str]] = set()
        self.takeovers = 0
        self.on_change: Callable[[], None] | None = None

    def active(self, fresh: bool = False) -> bool:
        if self.peering is None:
            return True
        changed = False
        with self._lock:
            if fresh or time.monotonic() - self._at >= self.ttl:
                answer, self._until = self._read()
                self._at = time.monotonic()
                self._answer = bool(answer)
                if answer is not None:
                    if answer and self._known is False:
                        self.takeovers += 1
                    changed = answer and (self._known is False or bool(self._refused))
                    self._known = answer
            result = self._answer
        if changed and self.on_change is not None:
            self.on_change()
        return result

    def refused(self, namespace: str, name: str) -> None:
        with self._lock:
            self._refused.add((namespace, name))

    def take_refused(self) -> set[tuple[str, str]]:
        with self._lock:
            refused, self._refused = self._refused, set()
        return refused

    def lapse_in(self) -> float | None:
        """Seconds (0 when already past) until the keep-alives that outranked this replica at
        the last read lapse, unless renewed meanwhile; None when none did."""
        with self._lock:
            until = self._until
        if until is None:
            return None
        return max(0.0, (until - dt.datetime.now(dt.UTC)).total_seconds())

    def _read(self) -> tuple[bool | None, dt.datetime | None]:
        """(may act, when the keep-alives outranking us lapse); (None, None): unreadable."""
        now = dt.datetime.now(dt.UTC)
        latest = None
        try:
            for path in self.peering.paths():
                peers = self.kube.request("GET", path).get("status", {}) or {}
                until = outranked_until(peers, self.peering.identity, self.peering.priority,
                                        now)
                if until is not None:
                    latest = until if latest is None else max(latest, until)
        except Exception as error:
            log.warning("cannot read the peering object (%s); not acting until it can", error)
            return None, None
        return latest is None, latest
