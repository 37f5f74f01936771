"""The operator's server-side watch selectors (handlers.WATCH_SELECTORS) against the labels the
render gives each child: a selector that stopped matching a child would leave its changes unseen
until the resync."""

from __future__ import annotations

from pathlib import Path

import yaml

from heteroserve_operator.api import InferenceDeploymentSpec
from heteroserve_operator.handlers import WATCH_SELECTORS
from heteroserve_operator.reconcile import cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import Owner
from tests.cluster.catalogue import load_catalogue

SAMPLES = Path(__file__).parents[2] / "crds" / "samples"
FACTS = cluster_facts([n.node_manifest() for n in load_catalogue()],
                      [n.topology_manifest() for n in load_catalogue()])
PLURALS = {"Service": ("", "v1", "services"), "ConfigMap": ("", "v1", "configmaps"),
           "Deployment": ("apps", "v1", "deployments"),
           "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
           "Ingress": ("networking.k8s.io", "v1", "ingresses")}


def matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality (`k=v`) and existence (`k`) terms, the only ones the operator uses."""
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if key not in labels or (value and labels[key] != value):
            return False
    return True


def children(sample: str) -> list[dict]:
    document = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    owner = Owner(document["metadata"]["name"], "ns", "u")
    return render(InferenceDeploymentSpec.model_validate(document["spec"]), owner, FACTS).children


def test_every_applied_child_is_watched():
    for path in sorted(SAMPLES.glob("*.yaml")):
        for child in children(path.stem):
            resource = PLURALS.get(child["kind"])
            if resource is None:
                continue
            assert matches(WATCH_SELECTORS[resource], child["metadata"]["labels"]), \
                (path.stem, child["kind"], child["metadata"]["name"])
            pods = child["spec"]["template"]["metadata"]["labels"] \
                if child["kind"] == "Deployment" else None
            if pods is not None:
                assert matches(WATCH_SELECTORS[("", "v1", "pods")], pods)


def test_endpoint_slices_of_the_router_service_only():
    """EndpointSlices carry their Service's labels: the router Service's are watched (RouterReady
    counts their ready endpoints), the headless decode Service's are not."""
    selector = WATCH_SELECTORS[("discovery.k8s.io", "v1", "endpointslices")]
    services = {c["metadata"]["name"]: c["metadata"]["labels"]
                for c in children("builtin-smollm2-cpu") if c["kind"] == "Service"}
    watched = {name for name, labels in services.items() if matches(selector, labels)}
    assert len(services) == 2 and len(watched) == 1
    (router,) = watched
    assert services[router]["app.kubernetes.io/component"] == "router"
