"""Watch-fed caches of the operator's children: client-go's informers, reduced to what the
reconciler needs.

Each `Informer` is a thread that LISTs one resource (a label selector, the whole cluster or one
namespace), then WATCHes it from that list's resourceVersion with bookmarks, keeps the objects in
a `Store`, and calls `on_event(type, object)` for every change. A watch that ends is resumed
from the last version seen; one that is too old (410 Gone) is followed by a fresh LIST, and the
objects that vanished meanwhile are reported as DELETED. Until its first LIST has arrived an
informer is not `synced`, and readers fall back to the API.

Why not kopf's watches: the operator used them for its children, and at 1,000
InferenceDeployments kopf's handling of each event (its Body wrapping, cause detection, handler
matching and invocation) was most of the operator's CPU in a py-spy profile
(docs/benchmarks.md, operator scale). Here an event costs a JSON decoding and a dict update.
Children that the reconciler only needs to know exist (ConfigMaps, Services, PDBs, Ingresses)
are watched as metadata only (`PartialObjectMetadata`, as controller-runtime's metadata-only
watches): the apiserver encodes, and the operator decodes, a fraction of each object. kopf still
watches the InferenceDeployments (and runs peering, liveness, start-up and clean-up).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from .kube import ApiError, KubeApi
from .render.meta import LABEL_OWNER

log = logging.getLogger(__name__)

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_ONLY_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

Key = tuple[str, str]            # (namespace, name)
Event = Callable[[str, dict[str, Any]], None]   # (ADDED|MODIFIED|DELETED, object)


@dataclass(frozen=True)
class WatchSpec:
    kind: str              # the object's kind ("Deployment"): metadata-only objects carry none
    group_version: str     # "apps/v1", "v1"
    plural: str
    selector: str          # a label selector, applied by the apiserver
    metadata_only: bool

    def path(self, namespace: str | None) -> str:
        prefix = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}" if namespace \
            else f"{prefix}/{self.plural}"


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of `obj` without metadata.managedFields (for caching)."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


class Gone(RuntimeError):
    """The watch's resourceVersion is too old (410): list again."""


def newer(version: str | None, than: str | None) -> bool:
    """`version` is later than `than`. resourceVersions are opaque to clients, but the
    apiserver's are etcd revisions, compared as integers the way client-go's mutation cache does;
    anything else counts as newer (the watch's order decides)."""
    if than is None:
        return True
    try:
        return int(version or "") > int(than)
    except ValueError:
        return True


class Store:
    """The objects of one informer by (namespace, name), and by (namespace, owner label)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._by_owner: defaultdict[Key, set[str]] = defaultdict(set)
        self.synced = False

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def owned(self, namespace: str, owner: str) -> list[dict[str, Any]]:
        with self._lock:
            names = self._by_owner.get((namespace, owner), ())
            return [self._objects[(namespace, n)] for n in names]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def keys(self) -> set[Key]:
        with self._lock:
            return set(self._objects)

    def put(self, obj: dict[str, Any], only_if_newer: bool = False) -> bool:
        """Stores `obj`; with `only_if_newer`, only when it is later than the stored one (an
        answer to the operator's own write, which its watch event may not have reached yet).
        True when stored."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        with self._lock:
            old = self._objects.get(key)
            if only_if_newer and old is not None and not newer(
                    meta.get("resourceVersion"), old["metadata"].get("resourceVersion")):
                return False
            if old is not None:
                self._unindex(key, old)
            self._objects[key] = obj
            owner = (meta.get("labels") or {}).get(LABEL_OWNER)
            if owner:
                self._by_owner[(key[0], owner)].add(key[1])
            return True

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            old = self._objects.pop((namespace, name), None)
            if old is not None:
                self._unindex((namespace, name), old)

    def _unindex(self, key: Key, old: dict[str, Any]) -> None:
        owner = (old["metadata"].get("labels") or {}).get(LABEL_OWNER)
        names = self._by_owner.get((key[0], owner)) if owner else None
        if names is not None:
            names.discard(key[1])
            if not names:
                del self._by_owner[(key[0], owner)]


def lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The newline-separated documents of a watch response's body."""
    rest = b""
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        yield from (p for p in parts if p.strip())
    if rest.strip():
        yield rest


class Informer:
    """One resource's LIST+WATCH loop in a daemon thread (see the module's docstring)."""

    def __init__(self, kube: KubeApi, spec: WatchSpec, on_event: Event,
                 namespace: str | None = None, timeout_seconds: int = 300,
                 retry_seconds: float = 1.0, store: Store | None = None):
        """`store`: where the objects are kept (one that another part also writes, as the
        reconciler's InferenceDeployments); default: its own."""
        self.kube, self.spec, self.on_event, self.namespace = kube, spec, on_event, namespace
        self.timeout_seconds, self.retry_seconds = timeout_seconds, retry_seconds
        self.store = store if store is not None else Store()
        self.version: str | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(
            target=self._run, daemon=True,
            name=f"watch-{spec.plural}{'-meta' if spec.metadata_only else ''}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:   # unblock the thread's read
            with contextlib.suppress(Exception):
                response.shutdown()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.store.synced and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.store.synced

    def _run(self) -> None:
        delay = self.retry_seconds
        while not self._stop.is_set():
            try:
                if self.version is None:
                    self._list()
                self._watch()
                delay = self.retry_seconds
            except Gone:
                log.info("watch of %s: resourceVersion %s expired; listing again",
                         self.spec.plural, self.version)
                self.version = None
            except Exception as error:
                if self._stop.is_set():
                    return
                log.warning("watch of %s failed (%s); retrying in %.0f s", self.spec.plural,
                            error, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def _accept(self, listing: bool) -> str:
        if not self.spec.metadata_only:
            return "application/json"
        return METADATA_ONLY_LIST if listing else METADATA_ONLY

    def _list(self) -> None:
        query = [("labelSelector", self.spec.selector)] if self.spec.selector else []
        query.append(("resourceVersion", "0"))
        body = self.kube.list_raw(self.spec.kind, self.spec.path(self.namespace), query,
                                  self._accept(listing=True))
        items = body.get("items") or []
        listed = set()
        for item in items:
            self._typed(item)
            meta = item["metadata"]
            listed.add((meta.get("namespace", ""), meta["name"]))
        vanished = self.store.keys() - listed
        for namespace, name in vanished:
            old = self.store.get(namespace, name)
            self.store.delete(namespace, name)
            if old is not None:
                self._deliver("DELETED", old)
        for item in items:
            self.store.put(item, only_if_newer=True)
            self._deliver("ADDED", item)
        self.version = (body.get("metadata") or {}).get("resourceVersion")
        self.store.synced = True

    def _watch(self) -> None:
        query = [("labelSelector", self.spec.selector)] if self.spec.selector else []
        query += [("watch", "true"),
                 ("allowWatchBookmarks", "true"), ("resourceVersion", self.version or "0"),
                 ("timeoutSeconds", str(self.timeout_seconds))]
        try:
            response = self.kube.open_stream(self.spec.path(self.namespace), query,
                                             self._accept(listing=False),
                                             read_timeout=self.timeout_seconds + 30)
        except ApiError as error:
            if error.status == 410:   # expired, answered to the request itself, not as an event
                raise Gone(str(error)) from error
            raise
        self._response = response
        try:
            for line in lines(response.stream(amt=None, decode_content=False)):
                if self._stop.is_set():
                    return
                self._handle(orjson.loads(line))
        finally:
            self._response = None
            response.release_conn()

    def _handle(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", ""))
            raise ApiError(obj.get("code") or 500, obj.get("message", "watch error"))
        meta = obj.get("metadata") or {}
        self.version = meta.get("resourceVersion") or self.version
        if kind == "BOOKMARK":
            return
        self._typed(obj)
        if kind == "DELETED":
            self.store.delete(meta.get("namespace", ""), meta["name"])
        else:
            # Watch events arrive in order; only the operator's own write, offered by the
            # reconcile that made it, can be later than the event at hand.
            self.store.put(obj, only_if_newer=True)
        self._deliver(kind, obj)

    def _typed(self, obj: dict[str, Any]) -> None:
        """Items of a LIST carry no kind and apiVersion, metadata-only objects the
        PartialObjectMetadata ones: the resource's own, as in a GET (the reconciler compares
        its manifests, kind and apiVersion included, with whole objects). managedFields are
        dropped, as controller-runtime's TransformStripManagedFields does: nothing here reads
        them, and they were the larger part of a cached object's memory."""
        obj["kind"] = self.spec.kind
        if not self.spec.metadata_only:
            obj["apiVersion"] = self.spec.group_version
        obj.get("metadata", {}).pop("managedFields", None)

    def _deliver(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self.on_event(kind, obj)
        except Exception:
            log.exception("handling a %s event of %s failed", kind, self.spec.plural)


class ChildCaches:
    """The informers of the operator's children, as the reconciler reads them: one informer
    per watched kind and namespace (or one for the whole cluster). A lookup that no synced
    informer can answer returns None, and the reconciler asks the API instead."""

    def __init__(self, kube: KubeApi, specs: tuple[WatchSpec, ...], on_event: dict[str, Event],
                 namespaces: tuple[str, ...] = (), timeout_seconds: int = 300):
        """`on_event`: the handler of each kind (specs' `kind`)."""
        self.namespaces = namespaces
        self.informers: dict[tuple[str, str | None], Informer] = {
            (spec.kind, namespace): Informer(kube, spec, on_event[spec.kind], namespace,
                                             timeout_seconds)
            for spec in specs for namespace in (namespaces or (None,))}

    def start(self) -> None:
        for informer in self.informers.values():
            informer.start()

    def stop(self) -> None:
        for informer in self.informers.values():
            informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(i.wait_synced(max(0.0, deadline - time.monotonic()))
                   for i in self.informers.values())

    def _store(self, kind: str, namespace: str) -> Store | None:
        informer = self.informers.get((kind, namespace if self.namespaces else None))
        return informer.store if informer is not None and informer.store.synced else None

    def child(self, kind: str, namespace: str, name: str) -> tuple[bool, dict[str, Any] | None]:
        """(known, object): known is False when no synced informer of `kind` covers
        `namespace`; else the object as last seen (metadata only for the metadata-only kinds),
        or None when it does not exist."""
        store = self._store(kind, namespace)
        return (False, None) if store is None else (True, store.get(namespace, name))

    def owned(self, kind: str, namespace: str, owner: str) -> list[dict[str, Any]] | None:
        """The objects of `kind` labelled with `owner`, or None when not known."""
        store = self._store(kind, namespace)
        return None if store is None else store.owned(namespace, owner)

    def offer(self, kind: str, obj: dict[str, Any] | None) -> None:
        """The answer to the operator's own write of a fully watched kind: kept unless the
        watch already delivered something later."""
        if not obj or not (obj.get("metadata") or {}).get("name"):
            return
        informer = self.informers.get(
            (kind, obj["metadata"].get("namespace") if self.namespaces else None))
        if informer is not None and not informer.spec.metadata_only:
            informer.store.put(without_managed_fields(obj), only_if_newer=True)
