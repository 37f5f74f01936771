"""The operator's informers (informer.py) on their edge cases: versions compared as the
apiserver's etcd revisions, the store's write-through of the operator's own writes, watch bodies
split anywhere, a watch that expires (410) and the objects that vanished meanwhile. Against the
real control plane they run in every operator test (tests/integration)."""

from __future__ import annotations

import json
import threading

from heteroserve_operator.informer import (
    METADATA_ONLY,
    METADATA_ONLY_LIST,
    ChildCaches,
    Informer,
    Store,
    WatchSpec,
    lines,
    newer,
)
from heteroserve_operator.kube import ApiError
from heteroserve_operator.render.meta import LABEL_OWNER


def obj(name: str, version: str, owner: str | None = "llm", **extra) -> dict:
    labels = {LABEL_OWNER: owner} if owner else {}
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": version,
                         "labels": labels, "managedFields": [{"manager": "x"}]}, **extra}


def test_versions_compare_as_integers_and_anything_else_is_newer():
    assert newer("10", "9") and not newer("9", "10") and not newer("10", "10")
    assert newer("5", None)
    assert newer("abc", "10") and newer("10", "abc")   # opaque: the watch's order decides


def test_store_keeps_the_operators_own_write_over_an_older_event():
    store = Store()
    assert store.put(obj("d", "10", status={"ready": 1}), only_if_newer=True)
    assert not store.put(obj("d", "9", status={"ready": 0}), only_if_newer=True)
    assert store.get("ns", "d")["status"] == {"ready": 1}
    assert store.put(obj("d", "11", status={"ready": 2}), only_if_newer=True)
    assert store.get("ns", "d")["metadata"]["resourceVersion"] == "11"


def test_store_indexes_by_owner_through_relabels_and_deletes():
    store = Store()
    store.put(obj("a", "1"))
    store.put(obj("b", "2"))
    store.put(obj("c", "3", owner="other"))
    assert sorted(o["metadata"]["name"] for o in store.owned("ns", "llm")) == ["a", "b"]
    store.put(obj("b", "4", owner="other"))          # relabelled
    assert [o["metadata"]["name"] for o in store.owned("ns", "llm")] == ["a"]
    store.delete("ns", "a")
    assert store.owned("ns", "llm") == [] and len(store) == 2
    assert sorted(o["metadata"]["name"] for o in store.owned("ns", "other")) == ["b", "c"]
    assert store.owned("elsewhere", "other") == []


def test_watch_lines_split_anywhere():
    events = [json.dumps({"type": "ADDED", "object": obj(f"o{i}", str(i))}).encode()
              for i in range(3)]
    body = b"\n".join(events) + b"\n"
    for size in (1, 7, 64, len(body)):
        chunks = [body[i:i + size] for i in range(0, len(body), size)]
        assert list(lines(iter(chunks))) == events
    assert list(lines(iter([b'{"a": 1}\n\n', b'{"b": 2}']))) == [b'{"a": 1}', b'{"b": 2}']


class FakeStream:
    def __init__(self, events: list[dict]):
        self.body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.released = False

    def stream(self, amt=None, decode_content=False):
        yield from (self.body[i:i + 50] for i in range(0, len(self.body), 50))

    def release_conn(self):
        self.released = True

    def shutdown(self):
        pass


class FakeKube:
    """LIST answers and WATCH streams, one after the other; the last WATCH blocks until the
    informer stops."""

    def __init__(self, lists: list[dict], watches: list[list[dict]]):
        self.lists, self.watches = lists, watches
        self.requests: list[tuple[str, str, dict]] = []
        self.done = threading.Event()

    def list_raw(self, kind, path, query, accept):
        self.requests.append(("list", accept, dict(query)))
        return self.lists.pop(0)

    def open_stream(self, path, query, accept, read_timeout):
        self.requests.append(("watch", accept, dict(query)))
        if not self.watches:
            self.done.set()
            raise ApiError(503, "no more")
        return FakeStream(self.watches.pop(0))


def test_an_expired_watch_lists_again_and_reports_what_vanished():
    kube = FakeKube(
        lists=[{"metadata": {"resourceVersion": "5"}, "items": [obj("a", "3"), obj("b", "4")]},
               {"metadata": {"resourceVersion": "20"}, "items": [obj("a", "12")]}],
        watches=[
            [{"type": "MODIFIED", "object": obj("a", "6")},
             {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
             {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}],
            [{"type": "ADDED", "object": obj("c", "21")}],
        ])
    seen: list[tuple[str, str, str]] = []
    spec = WatchSpec("ConfigMap", "v1", "configmaps", "a=b", metadata_only=True)
    informer = Informer(kube, spec, lambda t, o: seen.append(  # type: ignore[arg-type]
        (t, o["metadata"]["name"], o["metadata"]["resourceVersion"])), retry_seconds=0.01)
    informer.start()
    assert kube.done.wait(5)
    informer.stop()
    assert seen == [("ADDED", "a", "3"), ("ADDED", "b", "4"), ("MODIFIED", "a", "6"),
                    ("DELETED", "b", "4"), ("ADDED", "a", "12"), ("ADDED", "c", "21")]
    assert informer.store.synced and informer.store.keys() == {("ns", "a"), ("ns", "c")}
    assert informer.store.get("ns", "a")["kind"] == "ConfigMap"   # metadata-only objects
    verbs = [(r[0], r[2].get("resourceVersion")) for r in kube.requests]
    # The watch resumes from the list, the second list follows the 410, the last watch
    # resumes from the last event seen.
    assert verbs[:4] == [("list", "0"), ("watch", "5"), ("list", "0"), ("watch", "20")]
    assert verbs[4] == ("watch", "21")
    assert {r[1] for r in kube.requests if r[0] == "list"} == {METADATA_ONLY_LIST}
    assert {r[1] for r in kube.requests if r[0] == "watch"} == {METADATA_ONLY}
    assert all(r[2]["labelSelector"] == "a=b" and (r[0] == "list" or
               r[2]["allowWatchBookmarks"] == "true") for r in kube.requests)


def test_a_watch_refused_as_expired_lists_again():
    """The apiserver may answer the WATCH request itself with 410 Gone (not an ERROR event):
    resuming from that version would be refused forever."""

    class Expired(FakeKube):
        def open_stream(self, path, query, accept, read_timeout):
            if dict(query).get("resourceVersion") == "5":
                self.requests.append(("watch", accept, dict(query)))
                raise ApiError(410, "too old resource version: 5 (40)")
            return super().open_stream(path, query, accept, read_timeout)

    kube = Expired(
        lists=[{"metadata": {"resourceVersion": "5"}, "items": [obj("a", "3")]},
               {"metadata": {"resourceVersion": "40"}, "items": [obj("a", "30")]}],
        watches=[])
    spec = WatchSpec("ConfigMap", "v1", "configmaps", "a=b", metadata_only=True)
    informer = Informer(kube, spec, lambda t, o: None, retry_seconds=0.01)  # type: ignore
    informer.start()
    assert kube.done.wait(5)
    informer.stop()
    assert [(r[0], r[2].get("resourceVersion")) for r in kube.requests] == [
        ("list", "0"), ("watch", "5"), ("list", "0"), ("watch", "40")]
    assert informer.store.get("ns", "a")["metadata"]["resourceVersion"] == "30"


def test_listed_and_watched_objects_carry_their_kind_and_api_version():
    """A LIST's items carry neither, and the reconciler compares its manifests (kind and
    apiVersion included) with the cached Deployments: without them every cached Deployment
    would look drifted and be applied again."""
    kube = FakeKube(
        lists=[{"metadata": {"resourceVersion": "5"}, "items": [obj("a", "3")]}],
        watches=[[{"type": "ADDED", "object": obj("b", "6")}]])
    spec = WatchSpec("Deployment", "apps/v1", "deployments", "a=b", metadata_only=False)
    informer = Informer(kube, spec, lambda t, o: None, retry_seconds=0.01)  # type: ignore
    informer.start()
    assert kube.done.wait(5)
    informer.stop()
    for name in ("a", "b"):
        cached = informer.store.get("ns", name)
        assert (cached["apiVersion"], cached["kind"]) == ("apps/v1", "Deployment")
        assert "managedFields" not in cached["metadata"]   # never read, most of the memory


def test_caches_answer_only_when_synced_and_keep_own_writes_of_whole_kinds():
    kube = FakeKube(lists=[], watches=[])
    specs = (WatchSpec("Deployment", "apps/v1", "deployments", "x", metadata_only=False),
             WatchSpec("Service", "v1", "services", "x", metadata_only=True))
    caches = ChildCaches(kube, specs, {"Deployment": print, "Service": print})  # type: ignore
    assert caches.child("Deployment", "ns", "d") == (False, None)
    assert caches.owned("Deployment", "ns", "llm") is None
    for informer in caches.informers.values():
        informer.store.synced = True
    assert caches.child("Deployment", "ns", "d") == (True, None)
    caches.offer("Deployment", obj("d", "7", status={"availableReplicas": 1}))
    caches.offer("Service", obj("s", "8"))     # metadata-only: an answer is not what it holds
    assert caches.child("Deployment", "ns", "d")[1]["status"] == {"availableReplicas": 1}
    assert "managedFields" not in caches.child("Deployment", "ns", "d")[1]["metadata"]
    assert caches.child("Service", "ns", "s") == (True, None)
    assert [o["metadata"]["name"] for o in caches.owned("Deployment", "ns", "llm")] == ["d"]


def test_namespaced_caches_answer_for_their_namespaces_only():
    kube = FakeKube(lists=[], watches=[])
    specs = (WatchSpec("Deployment", "apps/v1", "deployments", "x", metadata_only=False),)
    caches = ChildCaches(kube, specs, {"Deployment": print}, namespaces=("ns", "b"))  # type: ignore
    assert {i.namespace for i in caches.informers.values()} == {"ns", "b"}
    assert specs[0].path("ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert specs[0].path(None) == "/apis/apps/v1/deployments"
    for informer in caches.informers.values():
        informer.store.synced = True
    assert caches.child("Deployment", "ns", "d") == (True, None)
    assert caches.child("Deployment", "elsewhere", "d") == (False, None)

