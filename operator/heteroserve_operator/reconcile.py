"""One idempotent, level-triggered reconcile of an InferenceDeployment.

Read the spec and the cluster facts -> render the desired children (pure) -> apply those that
differ from the live objects -> prune children no longer desired -> observe -> write status only
when it changed. An unchanged spec makes no writes.

The KV token Secret (render/kv_token.py) is the one child that is not applied: its value is made
here, once. The operator may create Secrets but not read them, so it cannot see whether the
Secret exists; it creates it (an existing one is left as it is) before applying a Deployment whose
pods mount it, and while the deployment is not Ready for its generation (pods that cannot mount a
deleted Secret keep it so). A Ready deployment with an unchanged spec still makes no writes.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from .api.models import InferenceDeploymentSpec
from .api.quantity import same_quantity
from .kube import KINDS, SECRET, ApiError, KubeApi
from .numa import NumaPlanError
from .render import kv_token
from .render.children import Rendered, possible_children, render
from .render.facts import ClusterFacts, NodeFacts, topology_from_labels, topology_from_nrt
from .render.meta import LABEL_COMPONENT, LABEL_OWNER, Owner
from .status import Observed, compute_status, transitions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    applied: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    status_written: bool = False
    error: str | None = None


# Fields the apiserver stores as quantities in canonical form ("1.5Gi" comes back "1536Mi"):
# the values of a container's resources.limits and resources.requests, an emptyDir's sizeLimit.
QUANTITY_MAPS = frozenset({"limits", "requests"})
QUANTITY_FIELDS = frozenset({"sizeLimit"})


def is_subset(desired: Any, live: Any, quantity: bool = False) -> bool:
    """True when every field the operator sets has that value in the live object (the
    apiserver adds defaults around them, which do not count as drift). Quantities are compared
    by value; `quantity`: the leaves below are quantities."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and is_subset(v, live[k], quantity or k in QUANTITY_MAPS
                                    or k in QUANTITY_FIELDS)
            for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(is_subset(d, item, quantity)
                        for d, item in zip(desired, live, strict=True)))
    return same_quantity(desired, live) if quantity else desired == live


def ready_for(status: dict[str, Any], generation: int) -> bool:
    """The last reconcile saw every tier ready at this generation."""
    ready = next((c for c in status.get("conditions", []) or [] if c.get("type") == "Ready"), {})
    return ready.get("status") == "True" and status.get("observedGeneration") == generation


def cluster_facts(nodes: list[dict[str, Any]], topologies: list[dict[str, Any]]
                  ) -> ClusterFacts:
    by_name = {t["metadata"]["name"]: t for t in topologies}
    facts = []
    for node in nodes:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels", {}) or {}
        smt = labels.get("feature.node.kubernetes.io/cpu-hardware_multithreading") == "true"
        topology = (topology_from_nrt(name, by_name[name], 2 if smt else 1)
                    if name in by_name else topology_from_labels(name, labels))
        facts.append(NodeFacts(name, labels, node.get("status", {}).get("allocatable", {}) or {},
                               topology))
    return ClusterFacts(tuple(facts))


class FactsCache:
    """Nodes and NodeResourceTopologies, listed at most once per `ttl` seconds: every reconcile
    needs them, and they change rarely. A node change is seen within `ttl`."""

    def __init__(self, kube: KubeApi, ttl: float):
        self.kube, self.ttl = kube, ttl
        self._lock = threading.Lock()
        self._facts: ClusterFacts | None = None
        self._at = 0.0

    def get(self) -> ClusterFacts:
        with self._lock:
            if self._facts is None or time.monotonic() - self._at >= self.ttl:
                self._facts = cluster_facts(self.kube.nodes(),
                                            self.kube.node_resource_topologies())
                self._at = time.monotonic()
            return self._facts


class Reconciler:
    def __init__(self, kube: KubeApi, registry: CollectorRegistry | None = None,
                 facts_ttl_seconds: float = 10.0):
        self.kube = kube
        self.facts = FactsCache(kube, facts_ttl_seconds)
        self.reconciles = Counter("heteroserve_operator_reconciles",
                                  "Reconciles of InferenceDeployments", ["result"],
                                  registry=registry)
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)

    def reconcile_by_name(self, namespace: str, name: str) -> Outcome | None:
        """Serialised per object, on a fresh read: triggers from several watches may carry
        stale copies, and a stale status would repeat its transition Events."""
        with self._locks[(namespace, name)]:
            body = self.kube.inference_deployment(namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            outcome = self._reconcile(body)
        self.reconciles.labels("error" if outcome.error else "ok").inc()
        return outcome

    def _reconcile(self, body: dict[str, Any]) -> Outcome:
        meta = body["metadata"]
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        generation = int(meta.get("generation", 0))
        previous = body.get("status", {}) or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            spec = InferenceDeploymentSpec.model_validate(body.get("spec", {}))
        except ValidationError as error:
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                for e in error.errors())
            return self._fail(body, previous, generation, now, "InvalidSpec", message)
        facts = self.facts.get()
        try:
            rendered = render(spec, owner, facts)
        except NumaPlanError as error:
            return self._fail(body, previous, generation, now, "NumaPlanFailed", str(error))
        try:
            token_ensured = False
            if rendered.kv_token_secret and not ready_for(previous, generation):
                self._ensure_kv_token(owner)
                token_ensured = True
            applied, pruned, deployments = self._sync_children(owner, rendered, token_ensured)
        except ApiError as error:
            return self._fail(body, previous, generation, now, "ApplyFailed", str(error))
        observed = self._observe(owner, spec, facts, deployments)
        status = compute_status(spec, generation, previous, now, endpoint=rendered.endpoint,
                                placement=rendered.placement, observed=observed)
        written = self._write_status(body, previous, status)
        return Outcome(tuple(applied), tuple(pruned), written)

    def _fail(self, body, previous, generation, now, reason, message) -> Outcome:
        log.warning("%s/%s: %s: %s", body["metadata"]["namespace"], body["metadata"]["name"],
                    reason, message)
        status = compute_status(None, generation, previous, now, error=(reason, message))
        written = self._write_status(body, previous, status)
        return Outcome(status_written=written, error=f"{reason}: {message}")

    def _write_status(self, body, previous: dict[str, Any], status: dict[str, Any]) -> bool:
        comparable = {k: v for k, v in previous.items() if k in status}
        if comparable == status and set(previous) <= set(status):
            return False
        meta = body["metadata"]
        # Keys that disappeared are removed explicitly (merge patch semantics).
        patch = {**{k: None for k in previous if k not in status}, **status}
        self.kube.patch_status(meta["namespace"], meta["name"], patch)
        for kind, reason, message in transitions(previous, status):
            self.kube.event(body, kind, reason, message)
        return True

    def _ensure_kv_token(self, owner: Owner) -> None:
        """Creates the KV token Secret with a fresh value unless it exists (then its value stays:
        it is never rotated by a reconcile). The value is never logged."""
        if self.kube.create_if_absent(SECRET, kv_token.secret(owner, secrets.token_urlsafe(32))):
            log.info("%s/%s: created the KV token Secret %s", owner.namespace, owner.name,
                     kv_token.secret_name(owner))

    def _sync_children(self, owner: Owner, rendered: Rendered, token_ensured: bool
                       ) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        """Applies what differs and prunes what is no longer desired; returns the live
        Deployments too (re-read when one was applied, for their status).

        Children have fixed names (render/names), so each is read by name: a handful of O(1)
        GETs instead of label-filtered LISTs that scan the whole namespace.
        """
        desired = {(c["apiVersion"], c["kind"], c["metadata"]["name"]): c
                   for c in rendered.children}
        unknown = set(desired) - set(possible_children(owner.name))
        if unknown:
            raise RuntimeError(f"rendered children missing from possible_children: {unknown}")
        applied, pruned = [], []
        deployments: list[dict[str, Any]] = []
        for api_version, kind_name, name in possible_children(owner.name):
            kind = KINDS[(api_version, kind_name)]
            key = (api_version, kind_name, name)
            current = self.kube.get(kind, owner.namespace, name)
            manifest = desired.get(key)
            if manifest is not None:
                # A GET's object carries apiVersion/kind; compare the rendered fields only.
                if current is None or not is_subset(manifest, current):
                    if kind_name == "Deployment" and rendered.kv_token_secret \
                            and not token_ensured:
                        self._ensure_kv_token(owner)  # before pods that mount it
                        token_ensured = True
                    current = self.kube.apply(manifest)
                    applied.append(f"{kind_name}/{name}")
                if kind_name == "Deployment":
                    deployments.append(current)
            elif current is not None:
                refs = current["metadata"].get("ownerReferences", []) or []
                if any(r.get("uid") == owner.uid for r in refs):
                    self.kube.delete(kind, owner.namespace, name)
                    pruned.append(f"{kind_name}/{name}")
        if applied or pruned:
            log.info("%s/%s: applied %s, pruned %s", owner.namespace, owner.name, applied,
                     pruned)
        return applied, pruned, deployments

    def _observe(self, owner: Owner, spec: InferenceDeploymentSpec, facts: ClusterFacts,
                 listed: list[dict[str, Any]]) -> Observed:
        deployments = {d["metadata"]["labels"].get(LABEL_COMPONENT): d for d in listed}
        ready_endpoints = sum(
            1 for s in self.kube.endpoint_slices(owner.namespace, owner.name)
            for e in s.get("endpoints", []) or []
            if (e.get("conditions") or {}).get("ready"))
        # One LIST of both tiers' pods (watch cache): the decode pods' nodes for the NUMA plans,
        # and every pod's scheduling and container state for why a tier is not ready.
        pods = tuple(self.kube.pods(
            owner.namespace, f"{LABEL_OWNER}={owner.name},{LABEL_COMPONENT} in (prefill,decode)"))
        decode_pods = tuple(
            (p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods
            if spec.decode and (p["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == "decode"
            and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))
        return Observed(deployments.get("prefill"), deployments.get("decode"), ready_endpoints,
                        decode_pods, facts, pods)
