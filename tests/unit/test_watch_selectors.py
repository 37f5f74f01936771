"""The operator's watch wiring (watches.py, handlers.py): its server-side watch selectors against
the labels the render gives each child (a selector that stopped matching a child would leave its
changes unseen until the resync), and which InferenceDeployment events queue a reconcile."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.reconcile import Reconciler, cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import LABEL_COMPONENT, Owner
from heteroserve_operator.watches import CHILD_WATCHES, SELECTORS, owner_event
from tests.cluster.catalogue import load_catalogue

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])


def matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality (`k=v`), existence (`k`) and set (`k in (a,b)`) terms, the only ones the
    operator uses."""
    terms, depth, term = [], 0, ""
    for char in selector + ",":
        depth += (char == "(") - (char == ")")
        if char == "," and depth == 0:
            terms.append(term.strip())
            term = ""
        else:
            term += char
    for term in terms:
        if " in (" in term:
            key, _, values = term.partition(" in (")
            if labels.get(key) not in values.rstrip(")").split(","):
                return False
            continue
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


def test_matches_reads_the_operators_selector_terms():
    assert matches("a=1,b,c in (x,y)", {"a": "1", "b": "", "c": "y"})
    assert not matches("a=1,b,c in (x,y)", {"a": "1", "b": "", "c": "z"})
    assert not matches("a=1,b", {"a": "1"})
    assert not matches("a=1", {"a": "2"})


def test_every_child_kind_is_watched_and_only_the_read_ones_whole():
    """Metadata only where the reconciler needs no more than existence and version; whole
    where it reads fields (a Deployment's status, slices' endpoints, pods' state)."""
    assert {s.kind: s.metadata_only for s in CHILD_WATCHES} == {
        "ConfigMap": True, "Service": True, "PodDisruptionBudget": True, "Ingress": True,
        "Deployment": False, "EndpointSlice": False, "Pod": False}


def children(sample: str) -> list[dict]:
    document = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    owner = Owner(document["metadata"]["name"], "ns", "u")
    return render(InferenceDeploymentSpec.model_validate(document["spec"]), owner, FACTS).children


def test_every_applied_child_is_watched():
    for path in sorted(SAMPLES.glob("*.yaml")):
        for child in children(path.stem):
            assert matches(SELECTORS[child["kind"]], child["metadata"]["labels"]), \
                (path.stem, child["kind"], child["metadata"]["name"])
            pods = child["spec"]["template"]["metadata"]["labels"] \
                if child["kind"] == "Deployment" else None
            if pods is not None:
                # The prefill and decode tiers' pods; the router's are not watched (its
                # Deployment's status and EndpointSlices report them).
                assert matches(SELECTORS["Pod"], pods) == (
                    pods[LABEL_COMPONENT] in ("prefill", "decode")), (path.stem, pods)


def test_endpoint_slices_of_the_router_service_only():
    """EndpointSlices carry their Service's labels: the router Service's are watched (RouterReady
    counts their ready endpoints), the headless decode Service's are not."""
    selector = SELECTORS["EndpointSlice"]
    services = {c["metadata"]["name"]: c["metadata"]["labels"]
                for c in children("builtin-smollm2-cpu") if c["kind"] == "Service"}
    watched = {name for name, labels in services.items() if matches(selector, labels)}
    assert len(services) == 2 and len(watched) == 1
    (router,) = watched
    assert services[router]["app.kubernetes.io/component"] == "router"


class _Queue:
    def __init__(self):
        self.added: list[tuple[str, str]] = []

    def add(self, namespace: str, name: str) -> None:
        self.added.append((namespace, name))


def _event(generation: int, observed: int, version: str = "7") -> dict:
    return {"apiVersion": "heteroserve.io/v1alpha1", "kind": "InferenceDeployment",
            "metadata": {"namespace": "ns", "name": "llm", "resourceVersion": version,
                         "generation": generation},
            "status": {"observedGeneration": observed}}


class _Loop:
    """Runs what the informer's thread hands to kopf's event loop at once."""

    def __init__(self):
        self.calls: list[tuple] = []

    def call_soon_threadsafe(self, function, *args):
        self.calls.append((function.__name__, *args))


def test_an_own_write_echo_queues_nothing_unless_the_spec_moved_past_the_status():
    """After a watch reconnect the one event delivered for an object may be the operator's own
    status write that followed a spec edit: that echo must still queue a reconcile. Every
    event reaches the binding scraper; a deletion queues nothing."""
    reconciler = Reconciler(kube=None)  # type: ignore[arg-type]
    reconciler._wrote("InferenceDeployment", {"metadata": {"namespace": "ns", "name": "llm",
                                                           "resourceVersion": "7"}})
    queue, loop = _Queue(), _Loop()
    bindings = SimpleNamespace(owner_event=lambda body, kind: None)
    on_event = owner_event(reconciler, queue, bindings, loop)  # type: ignore[arg-type]
    on_event("MODIFIED", _event(3, 3))
    assert queue.added == []                           # the echo of its own write
    on_event("MODIFIED", _event(4, 3))
    assert queue.added == [("ns", "llm")]              # own write, but the spec moved on
    on_event("MODIFIED", _event(3, 3, "8"))
    assert queue.added == [("ns", "llm")] * 2          # someone else's write
    on_event("DELETED", _event(3, 3, "9"))
    assert queue.added == [("ns", "llm")] * 2
    assert [c[0] for c in loop.calls] == ["<lambda>"] * 4
    assert [c[2] for c in loop.calls] == ["MODIFIED"] * 3 + ["DELETED"]
