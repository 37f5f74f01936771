"""The reconciler's cache of cluster facts (reconcile.FactsCache)."""

from __future__ import annotations

from types import SimpleNamespace

from heteroserve_operator.reconcile import FactsCache


def test_cluster_facts_keep_their_identity_while_equal():
    """Renders are reused while the facts object is the same (Reconciler._renders): a listing
    that finds the nodes unchanged keeps it; a changed node replaces it."""
    nodes = [{"metadata": {"name": "n1", "labels": {"a": "1"}},
              "status": {"allocatable": {"cpu": "64"}}}]
    kube = SimpleNamespace(nodes=lambda: [dict(n) for n in nodes],
                           node_resource_topologies=lambda: [])
    cache = FactsCache(kube, ttl=0.0)  # type: ignore[arg-type]
    first = cache.get()
    assert cache.get() is first
    nodes[0] = {"metadata": {"name": "n1", "labels": {"a": "2"}},
                "status": {"allocatable": {"cpu": "64"}}}
    second = cache.get()
    assert second is not first and second.nodes[0].labels == {"a": "2"}
