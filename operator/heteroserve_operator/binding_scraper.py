"""Learns what each decode engine bound from its /metrics, for `status.decodeBindings`
(decode_bindings.py says what the entries mean). Apart from the reconcile, on kopf's event loop.

- Watch-driven: the operator's pod and InferenceDeployment informers (informer.py) keep an
  index of the decode engines (pod IP, port, container start, readiness) and of each
  deployment's live `decodeBindings`.
  An idle cluster sends no events, so the scraper reads nothing and writes nothing.
- Each engine start is read once, when its container is ready: GET http://<pod IP>:<port>/metrics
  with a short total timeout, a bounded number at a time; a failure is retried with doubling
  back-off (`ScrapeSettings`), an answer never again until the container restarts.
- The scraper writes nothing itself: a deployment's entries that differ from the live ones are
  published (`entries_for`) and the deployment is queued for a reconcile, whose status write
  carries them (status.py), together with whatever else changed. A thousand new deployments
  cost one status write each fewer than when the scraper patched the field on its own (its
  entries usually land in the write that reports the pods ready), and there is one writer of
  the status. A reconcile that ran before an entry was published is followed by the one the
  publication queued.
- On start (or a peering hand-over) the entries already in the status are adopted for the
  engine starts they name, so a restarted operator neither re-reads every engine nor writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kopf
from prometheus_client import CollectorRegistry, Counter

from heteroserve_engines.protocol.binding_report import BindingReportError, find_binding

from .decode_bindings import (
    FIELD,
    DecodeEngine,
    EngineKey,
    Learned,
    OwnerKey,
    adopt,
    decode_engine,
    entries,
    retry_delay,
)
from .informer import ChildCaches
from .kube import ApiError, KubeApi
from .peering import PeeringGate
from .render.meta import LABEL_OWNER

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScrapeSettings:
    # Seconds one read of an engine's /metrics may take in all (connect, headers, body). A
    # decode engine answers in milliseconds; a pod address that does not route costs this much.
    timeout_seconds: float = 2.0
    # Engines read at the same time: a rollout of many pods does not open a burst of sockets.
    concurrency: int = 8
    # Seconds before the first retry of a failed read; doubled per failure up to the cap.
    retry_first_seconds: float = 5.0
    retry_max_seconds: float = 300.0
    # Bytes of /metrics read at most; a longer answer counts as one without the binding (a
    # foreign engine's exposition; heteroserve's is a few KiB).
    max_body_bytes: int = 4 * 2**20
    # Seconds the loop lets a burst of watch events gather before a pass.
    batch_seconds: float = 0.2
    # Seconds before a failed pod listing (or a paused peering replica) looks again.
    retry_pass_seconds: float = 5.0
    # Seconds the loop waits after start-up before its first pass, so that the informers' first
    # listings of pods and InferenceDeployments have arrived (a deployment seen before its pods
    # costs one LIST of them; see _publish_changed).
    settle_seconds: float = 2.0


class ScrapeFailed(RuntimeError):
    """The engine's /metrics could not be read (retried later)."""


@dataclass
class _Attempts:
    failures: int = 0
    next_at: float = 0.0
    last_error: str = ""


class BindingScraper:
    def __init__(self, kube: KubeApi, gate: PeeringGate, registry: CollectorRegistry | None = None,
                 settings: ScrapeSettings | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 request_reconcile: Callable[[str, str], None] | None = None):
        self.kube, self.gate = kube, gate
        # Queues a deployment for a reconcile (the work queue's `add`, which any thread may
        # call): its status write carries the entries published here.
        self.request_reconcile = request_reconcile
        self.settings = settings or ScrapeSettings()
        self.transport = transport
        self.scrapes = Counter("heteroserve_operator_binding_scrapes",
                               "Reads of decode engines' /metrics for their CPU binding, by "
                               "result (reported, not_reported, failed)", ["result"],
                               registry=registry)
        self.engines: dict[tuple[str, str], DecodeEngine] = {}   # (namespace, pod)
        # owner -> its engines' (namespace, pod): a deployment's entries without a scan of
        # every engine (a thousand deployments' writes scanned a thousand engines each).
        self._owned: defaultdict[OwnerKey, set[tuple[str, str]]] = defaultdict(set)
        self.learned: dict[EngineKey, Learned] = {}
        self.attempts: dict[EngineKey, _Attempts] = {}
        # (namespace, pod) of the engines that can be read and are not learned yet: a pass
        # looks at these, not at every engine (a thousand learned engines cost nothing).
        self._unread: set[tuple[str, str]] = set()
        self.live: dict[OwnerKey, list[dict[str, Any]] | None] = {}  # seen deployments only
        # The entries a reconcile writes, by deployment; replaced, never changed in place (the
        # reconcile's worker threads read them).
        self.published: dict[OwnerKey, list[dict[str, Any]]] = {}
        self.dirty: set[OwnerKey] = set()
        # The operator's pod informer (watches.py), once it runs: its synced cache answers the
        # check before a write instead of a LIST.
        self.caches: ChildCaches | None = None
        self._wake = asyncio.Event()
        self._retry_pass_at = 0.0

    # -- what the watches say (kopf's event loop) ------------------------------------------------
    def pod_event(self, pod: Mapping[str, Any], event_type: str | None) -> None:
        meta = pod.get("metadata") or {}
        where = (meta.get("namespace", ""), meta.get("name", ""))
        before = self.engines.get(where)
        engine = None if event_type == "DELETED" else decode_engine(pod)
        if engine == before:
            return
        if engine is None:
            self._drop_engine(where)
        else:
            self._set_engine(where, engine)
            if before is not None and engine.key in self.attempts and \
                    (before.address, before.port) != (engine.address, engine.port):
                self.attempts.pop(engine.key)   # a new address: read it now
        self.dirty.add((before or engine).owner_key)
        self._wake.set()

    def _set_engine(self, where: tuple[str, str], engine: DecodeEngine) -> None:
        old = self._drop_engine(where, forget=False)
        self.engines[where] = engine
        self._owned[engine.owner_key].add(where)
        if old is not None:
            self._forget(old.key)
        self._track(where)

    def _drop_engine(self, where: tuple[str, str], forget: bool = True
                     ) -> DecodeEngine | None:
        engine = self.engines.pop(where, None)
        self._unread.discard(where)
        if engine is not None:
            owned = self._owned.get(engine.owner_key)
            if owned is not None:
                owned.discard(where)
                if not owned:
                    del self._owned[engine.owner_key]
            if forget:
                self._forget(engine.key)
        return engine

    def _forget(self, key: EngineKey | None) -> None:
        """Drops what was learned of an engine start that no engine has any more (its pod is
        gone, or its container started again)."""
        if key is None:
            return
        current = self.engines.get(key[:2])
        if current is None or current.key != key:
            self.learned.pop(key, None)
            self.attempts.pop(key, None)

    def _track(self, where: tuple[str, str]) -> None:
        """Keeps `_unread` true for one engine."""
        engine = self.engines.get(where)
        if engine is not None and engine.metrics_url() and engine.key not in self.learned:
            self._unread.add(where)
        else:
            self._unread.discard(where)

    def owner_event(self, body: Mapping[str, Any], event_type: str | None) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED" or meta.get("deletionTimestamp"):
            self.live.pop(key, None)
            self.published.pop(key, None)
            self.dirty.discard(key)
            return
        value = (body.get("status") or {}).get(FIELD)
        if key in self.live and self.live[key] == value:
            return
        self.live[key] = value
        self.dirty.add(key)
        self._wake.set()

    def entries_for(self, namespace: str, name: str) -> list[dict[str, Any]] | None:
        """The deployment's entries as learned (empty: none), or None when the scraper has
        nothing to say of it yet (the reconcile then keeps the status's own). Any thread."""
        return self.published.get((namespace, name))

    # -- the loop --------------------------------------------------------------------------------
    async def run(self) -> None:
        timeout = httpx.Timeout(self.settings.timeout_seconds)
        async with httpx.AsyncClient(timeout=timeout, transport=self.transport,
                                     trust_env=False) as client:
            limit = asyncio.Semaphore(self.settings.concurrency)
            await asyncio.sleep(self.settings.settle_seconds)
            while True:
                delay = self._next_due() - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), delay)
                    if self._wake.is_set():
                        # Events come in bursts (a rollout's pods): one pass for the burst,
                        # not one per event (each pass looks at every engine).
                        await asyncio.sleep(self.settings.batch_seconds)
                self._wake.clear()
                try:
                    await self.step(client, limit)
                except Exception:
                    log.exception("learning the decode engines' bindings failed; retrying")
                    self._retry_pass_at = time.monotonic() + self.settings.retry_pass_seconds

    def _next_due(self) -> float:
        """When the loop has work next: dirty deployments at once, else the earliest retry; not
        before a failed write's (or a paused replica's) pause is over."""
        if self.dirty:
            due = time.monotonic()
        else:
            keys = (self.engines[where].key for where in self._unread)
            due = min((self.attempts[k].next_at for k in keys if k in self.attempts),
                      default=time.monotonic() + 3600.0)
        return max(due, self._retry_pass_at)

    async def step(self, client: httpx.AsyncClient, limit: asyncio.Semaphore) -> None:
        """Reads what is due, writes what changed."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if not await loop.run_in_executor(None, self.gate.active):
            # Paused (another replica writes): what was published may go stale meanwhile. The
            # reconciles of a replica made active again carry the status's own entries until
            # a pass publishes afresh.
            self.published.clear()
            self._retry_pass_at = now + self.settings.retry_pass_seconds
            return
        # Only a dirty deployment's engines can have something to adopt (a new engine, or
        # entries the status gained).
        for owner in list(self.dirty):
            for where in list(self._owned.get(owner, ())):
                self._adopt(self.engines[where])
        due = [e for e in map(self.engines.__getitem__, self._unread)
               if self.attempts.get(e.key, _Attempts()).next_at <= now]
        results = await asyncio.gather(*(self._read(client, limit, e) for e in due))
        for engine, result in zip(due, results, strict=True):
            current = self.engines.get((engine.namespace, engine.pod))
            if current is not None and current.key == engine.key:   # the same engine start
                self._record(engine, result)
        await self._publish_changed(loop)

    def _adopt(self, engine: DecodeEngine) -> None:
        if engine.key and engine.key not in self.learned:
            adopted = adopt(self.live.get(engine.owner_key), engine)
            if adopted is not None:
                self.learned[engine.key] = adopted
                self._unread.discard((engine.namespace, engine.pod))

    async def _read(self, client: httpx.AsyncClient, limit: asyncio.Semaphore,
                    engine: DecodeEngine) -> Learned | ScrapeFailed:
        async with limit:
            try:
                return await asyncio.wait_for(self._scrape(client, engine.metrics_url()),
                                              self.settings.timeout_seconds)
            except TimeoutError:
                return ScrapeFailed(f"no answer within {self.settings.timeout_seconds:g} s")
            except (httpx.HTTPError, ScrapeFailed, BindingReportError) as error:
                return ScrapeFailed(str(error) or type(error).__name__)
            except Exception as error:  # one engine's oddity must not stop the others' reads
                return ScrapeFailed(f"{type(error).__name__}: {error}")

    async def _scrape(self, client: httpx.AsyncClient, url: str) -> Learned:
        async with client.stream("GET", url) as response:
            if response.status_code == 404:
                return Learned(None)   # no /metrics at all
            if response.status_code != 200:
                raise ScrapeFailed(f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.settings.max_body_bytes:
                    return Learned(None)
        return Learned(find_binding(body.decode("utf-8", errors="replace")))

    def _record(self, engine: DecodeEngine, result: Learned | ScrapeFailed) -> None:
        if isinstance(result, Learned):
            self.learned[engine.key] = result
            self.attempts.pop(engine.key, None)
            self._unread.discard((engine.namespace, engine.pod))
            self.scrapes.labels("reported" if result.binding else "not_reported").inc()
            self.dirty.add(engine.owner_key)
            return
        self.scrapes.labels("failed").inc()
        attempts = self.attempts.setdefault(engine.key, _Attempts())
        attempts.failures += 1
        delay = retry_delay(attempts.failures, self.settings.retry_first_seconds,
                            self.settings.retry_max_seconds)
        attempts.next_at = time.monotonic() + delay
        if str(result) != attempts.last_error:   # one line per engine start and cause
            attempts.last_error = str(result)
            log.warning("%s/%s: cannot read the decode engine's binding from %s: %s (retrying "
                        "with back-off)", engine.namespace, engine.pod, engine.metrics_url(),
                        result)

    def _wanted(self, owner: OwnerKey) -> list[dict[str, Any]]:
        engines = [self.engines[where] for where in self._owned.get(owner, ())]
        for engine in engines:
            self._adopt(engine)
        return entries(engines, self.learned)

    def _replace_engines(self, owner: OwnerKey, pods: list[dict[str, Any]]) -> None:
        dropped = [self._drop_engine(where, forget=False)
                   for where in list(self._owned.get(owner, ()))]
        for pod in pods:
            engine = decode_engine(pod)
            if engine is not None and engine.owner_key == owner:
                self._set_engine((engine.namespace, engine.pod), engine)
        for engine in dropped:
            if engine is not None:
                self._forget(engine.key)

    async def _publish_changed(self, loop: asyncio.AbstractEventLoop) -> None:
        """Publishes each dirty deployment's entries and queues a reconcile of those whose
        entries differ from the live ones. Before that, the pods the operator's informer holds
        (or, until it has listed, one LIST of them from the apiserver's watch cache) check the
        index: the pod and InferenceDeployment watches deliver independently (at start-up, a
        deployment's listing may come before its pods'), and entries made from half an index
        would be wrong."""
        owners = sorted(self.dirty)
        self.dirty.difference_update(owners)
        for owner in owners:
            await self._publish_one(loop, owner)

    async def _publish_one(self, loop: asyncio.AbstractEventLoop, owner: OwnerKey) -> None:
        if owner not in self.live:
            return   # not seen yet: its first event marks it again
        wanted = self._wanted(owner)
        if wanted != (self.live[owner] or []):
            namespace, name = owner
            try:
                pods = self.caches.owned("Pod", namespace, name) if self.caches else None
                if pods is None:
                    pods = await loop.run_in_executor(None, self.kube.pods, namespace,
                                                      f"{LABEL_OWNER}={name}")
            except ApiError as error:
                log.warning("%s/%s: cannot list the pods for %s: %s", namespace, name, FIELD,
                            error)
                self.dirty.add(owner)
                self._retry_pass_at = time.monotonic() + self.settings.retry_pass_seconds
                return
            self._replace_engines(owner, pods)
            wanted = self._wanted(owner)
            self._wake.set()   # engines the listing added may be due for a read
        self.published[owner] = wanted
        if wanted != (self.live.get(owner) or []) and self.request_reconcile is not None:
            self.request_reconcile(*owner)


# -- kopf wiring (the scraper arrives through kopf's memo, built in __main__) ---------------------
@kopf.on.startup()
async def start_binding_scraper(memo: kopf.Memo, **_) -> None:
    memo.binding_task = asyncio.create_task(memo.bindings.run())


@kopf.on.cleanup()
async def stop_binding_scraper(memo: kopf.Memo, **_) -> None:
    task = getattr(memo, "binding_task", None)
    if task:
        task.cancel()
