"""The operator's object cache: latest copy wins, older events never step back, label selection."""

from __future__ import annotations

from heteroserve_operator.cache import ObjectCache


def obj(name: str, rv: str, labels: dict | None = None, ns: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv,
                         "labels": labels or {}}}


def test_latest_copy_wins_and_older_events_are_ignored():
    cache = ObjectCache()
    cache.upsert("Deployment", obj("a", "10"))
    cache.upsert("Deployment", obj("a", "12"))
    cache.upsert("Deployment", obj("a", "11"))  # a watch event behind our own write
    assert cache.get("Deployment", "ns", "a")["metadata"]["resourceVersion"] == "12"
    cache.delete("Deployment", "ns", "a")
    assert cache.get("Deployment", "ns", "a") is None


def test_select_by_kind_namespace_and_labels():
    cache = ObjectCache()
    cache.upsert("Pod", obj("p1", "1", {"app": "x", "tier": "decode"}))
    cache.upsert("Pod", obj("p2", "1", {"app": "x", "tier": "prefill"}))
    cache.upsert("Pod", obj("p3", "1", {"app": "x", "tier": "decode"}, ns="other"))
    cache.upsert("Service", obj("s", "1", {"app": "x", "tier": "decode"}))
    names = [o["metadata"]["name"] for o in cache.select("Pod", "ns", {"tier": "decode"})]
    assert names == ["p1"]
