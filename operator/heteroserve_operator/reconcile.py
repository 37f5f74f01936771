"""One idempotent, level-triggered reconcile of an InferenceDeployment.

Read the spec and the cluster facts -> render the desired children (pure) -> apply those that
differ from the live objects -> prune children no longer desired -> observe -> write status only
when it changed. An unchanged spec makes no writes.

Reads are what the operator adds to the control plane's load at scale (docs/benchmarks.md,
operator scale), so a reconcile reads only what can have changed:
- The first reconcile of an object (no status yet: it was never reconciled) applies every
  desired child without reading it first, and lists no pods or endpoints while the Deployments it
  applied are brand new. If one of them is not (an operator killed before its first status write
  made it), the reconcile goes on to read, prune and observe as any other; else a child left
  over from such a kill is pruned by the next reconcile, which the children's events trigger.
- Once the operator's informers have listed (informer.py, watches.py), the children are read
  from their watch caches: a child the cache knows absent is applied without a read, a
  Deployment is compared with its cached copy (the answer to the operator's own apply kept over
  any older event), pods and EndpointSlices come from the caches instead of LISTs, and the
  InferenceDeployment is the latest of its watch events and the operator's own status writes.
- A child other than a Deployment (SEEN_KINDS: the caches hold their metadata only) that the
  operator's watch has seen no event of since the operator applied it (or read it as desired),
  with the same spec hash, is not read; else it is read by a GET.
- The periodic resync's reconcile reads everything from the API.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError

from .api.models import KIND, InferenceDeploymentSpec
from .api.quantity import same_quantity
from .informer import ChildCaches, Store, without_managed_fields
from .kube import KINDS, REPLICA_SET, SECRET, ApiError, Kind, KubeApi
from .numa import NumaPlanError
from .render import kv_token
from .render.children import Rendered, possible_children, render
from .render.facts import ClusterFacts, NodeFacts, topology_from_labels, topology_from_nrt
from .render.meta import LABEL_COMPONENT, LABEL_OWNER, SPEC_HASH, Owner
from .rollout import DESIRED_REPLICAS, held_rollout, may_be_held
from .status import Observed, compute_status, transitions

log = logging.getLogger(__name__)

DEPLOYMENT = KINDS[("apps/v1", "Deployment")]


def _failure(error: Exception) -> str:
    """A kind of failure, for logging each once: the HTTP status, else the exception's type."""
    return f"HTTP {error.status}" if isinstance(error, ApiError) else type(error).__name__


@dataclass(frozen=True)
class Outcome:
    applied: tuple[str, ...] = ()
    pruned: tuple[str, ...] = ()
    status_written: bool = False
    error: str | None = None


SERVICE_NAME = "kubernetes.io/service-name"   # an EndpointSlice's Service

# Child kinds whose watch events the reconciler follows to skip reading them (handlers.py watches
# every child kind; Deployments are read anyway, for their status).
SEEN_KINDS = frozenset({"ConfigMap", "Service", "PodDisruptionBudget", "Ingress"})

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
        """The facts; the same object for as long as they are equal (renders are reused while
        it is: Reconciler._renders)."""
        with self._lock:
            if self._facts is None or time.monotonic() - self._at >= self.ttl:
                facts = cluster_facts(self.kube.nodes(), self.kube.node_resource_topologies())
                if facts != self._facts:
                    self._facts = facts
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
        self.rollouts_released = Counter(
            "heteroserve_operator_rollouts_released",
            "Deployment rollouts that kube-controller-manager held (a stale desired-replicas "
            "annotation, kubernetes/kubernetes#102551) released by the operator",
            ["component"], registry=registry)
        # (namespace, Deployment, failure) already logged by _warn_once.
        self._release_failures: set[tuple[str, str, str]] = set()
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        # (kind, namespace, name) -> the resourceVersion this operator's last write produced, so
        # that the watch event echoing that write triggers no reconcile (nothing changed that
        # the reconcile which wrote it did not already see).
        self._own_versions: dict[tuple[str, str, str], str] = {}
        # Children other than Deployments (SEEN_KINDS): the spec hash of
        # what this operator last applied, and the resourceVersion its watch saw last. While
        # the watch has seen nothing since that apply, the child is as applied and is not read
        # again (a later edit's event queues a reconcile that reads it).
        self._applied_hashes: dict[tuple[str, str, str], str] = {}
        self._seen_versions: dict[tuple[str, str, str], str | None] = {}
        # (namespace, name) -> ((uid, generation), facts, spec, rendered): the render is pure,
        # and a spec changes only with its generation; the facts are listed again every
        # `facts_ttl_seconds`, and a change of them renders everything again (a node's change
        # is seen as before).
        self._renders: dict[tuple[str, str], tuple[Any, ClusterFacts, InferenceDeploymentSpec,
                                                   Rendered]] = {}
        # Objects whose next reconcile reads every child (the periodic resync: the safety net
        # does not rely on the watches it backs up).
        self._read_all: set[tuple[str, str]] = set()
        # The watch-fed caches of the children (informer.py), set once they run; None: every
        # read goes to the API.
        self.caches: ChildCaches | None = None
        # The binding scraper's published `decodeBindings` entries (binding_scraper.py's
        # `entries_for`), set by __main__; None: the status's own are carried over.
        self.decode_bindings: Callable[[str, str], list[dict[str, Any]] | None] | None = None
        # The InferenceDeployments as last seen: the operator's watch of them (watches.py keeps
        # them here) and this operator's own status writes, whichever is later (a reconcile
        # must not start from a status older than its own last write: it would repeat that
        # write's transition Events).
        self.owners = Store()

    def is_own_write(self, kind: str, namespace: str, name: str, version: str | None) -> bool:
        """True when (kind, namespace, name) at `version` is what this operator last wrote."""
        return version is not None and self._own_versions.get((kind, namespace, name)) == version

    def saw(self, kind: str, namespace: str, name: str, version: str | None) -> None:
        """A watch event of a child (`version` None: deleted)."""
        if kind in SEEN_KINDS:
            self._seen_versions[(kind, namespace, name)] = version

    def read_all_next(self, namespace: str, name: str) -> None:
        self._read_all.add((namespace, name))

    def forget(self, kind: str, namespace: str, name: str) -> None:
        for known in (self._own_versions, self._applied_hashes, self._seen_versions):
            known.pop((kind, namespace, name), None)
        if kind == KIND:
            self._renders.pop((namespace, name), None)
        if kind == "Deployment":
            self._release_failures = {k for k in self._release_failures
                                      if k[:2] != (namespace, name)}

    def _wrote(self, kind: str, written: dict[str, Any] | None,
               manifest: dict[str, Any] | None = None) -> None:
        meta = (written or {}).get("metadata") or {}
        if meta.get("resourceVersion") and meta.get("name") and meta.get("namespace"):
            if kind == KIND and written is not None:
                self.owners.put(without_managed_fields(written), only_if_newer=True)
            key = (kind, meta["namespace"], meta["name"])
            self._own_versions[key] = meta["resourceVersion"]
            spec_hash = ((manifest or {}).get("metadata", {}).get("annotations") or {}).get(
                SPEC_HASH)
            if kind in SEEN_KINDS and spec_hash:
                self._applied_hashes[key] = spec_hash

    def _verified(self, kind: str, live: dict[str, Any], manifest: dict[str, Any]) -> None:
        """A child read and found as desired counts as applied at the version read."""
        if kind in SEEN_KINDS:
            self._wrote(kind, live, manifest)

    def _unchanged_since_applied(self, manifest: dict[str, Any]) -> bool:
        kind, meta = manifest["kind"], manifest["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        own = self._own_versions.get(key)
        return (kind in SEEN_KINDS and own is not None
                and self._seen_versions.get(key) == own
                and self._applied_hashes.get(key) == (meta.get("annotations") or {}).get(
                    SPEC_HASH))

    def reconcile_by_name(self, namespace: str, name: str) -> Outcome | None:
        """Serialised per object, on the latest copy seen (`owners`): triggers from several
        watches may carry stale copies, and a stale status would repeat its transition
        Events."""
        with self._locks[(namespace, name)]:
            read_all = (namespace, name) in self._read_all
            self._read_all.discard((namespace, name))
            # The object as the operator's watch or its own last write left it; read afresh
            # when not seen (yet), and by the periodic resync.
            body = None if read_all else self.owners.get(namespace, name)
            if body is None:
                body = self.kube.inference_deployment(namespace, name)
                if body is not None:
                    self.owners.put(without_managed_fields(body), only_if_newer=True)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.forget(KIND, namespace, name)
                self.owners.delete(namespace, name)
                return None
            outcome = self._reconcile(body, read_all)
        self.reconciles.labels("error" if outcome.error else "ok").inc()
        return outcome

    def _reconcile(self, body: dict[str, Any], read_all: bool = True) -> Outcome:
        meta = body["metadata"]
        owner = Owner(meta["name"], meta["namespace"], meta["uid"])
        generation = int(meta.get("generation", 0))
        previous = body.get("status", {}) or {}
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        facts = self.facts.get()
        key = (owner.namespace, owner.name)
        cached = self._renders.get(key)
        if cached is not None and cached[0] == (owner.uid, generation) and cached[1] is facts:
            spec, rendered = cached[2], cached[3]
        else:
            try:
                spec = InferenceDeploymentSpec.model_validate(body.get("spec", {}))
            except ValidationError as error:
                message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                    for e in error.errors())
                return self._fail(body, previous, generation, now, "InvalidSpec", message)
            try:
                rendered = render(spec, owner, facts)
            except NumaPlanError as error:
                return self._fail(body, previous, generation, now, "NumaPlanFailed", str(error))
            self._renders[key] = ((owner.uid, generation), facts, spec, rendered)
        try:
            token_ensured = False
            if rendered.kv_token_secret and not ready_for(previous, generation):
                self._ensure_kv_token(owner)
                token_ensured = True
            applied: list[str] = []
            pruned: list[str] = []
            first = not previous
            if first:
                applied, deployments = self._first_apply(owner, rendered, token_ensured)
                token_ensured = token_ensured or bool(rendered.kv_token_secret)
                # A Deployment that a controller has acted on existed before this reconcile
                # (an operator killed before its first status write): read and prune as usual.
                first = all(not (d.get("status") or {}) for d in deployments)
            if not first:
                more, pruned, deployments = self._sync_children(owner, rendered, token_ensured,
                                                                read_all)
                applied += more
        except ApiError as error:
            return self._fail(body, previous, generation, now, "ApplyFailed", str(error))
        if not first:
            self._release_held_rollouts(body, deployments)
        if first:
            # Deployments this reconcile created: no controller has acted on them yet, so
            # there are no pods or endpoints to list.
            observed = Observed(*(self._by_component(deployments)), 0, (), facts, ())
        else:
            observed = self._observe(owner, spec, facts, deployments, read_all)
        status = compute_status(spec, generation, previous, now, endpoint=rendered.endpoint,
                                placement=rendered.placement, observed=observed,
                                decode_bindings=self._decode_bindings(body))
        written = self._write_status(body, previous, status)
        return Outcome(tuple(applied), tuple(pruned), written)

    def _fail(self, body, previous, generation, now, reason, message) -> Outcome:
        log.warning("%s/%s: %s: %s", body["metadata"]["namespace"], body["metadata"]["name"],
                    reason, message)
        status = compute_status(None, generation, previous, now, error=(reason, message),
                                decode_bindings=self._decode_bindings(body))
        written = self._write_status(body, previous, status)
        return Outcome(status_written=written, error=f"{reason}: {message}")

    def _decode_bindings(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The binding scraper's entries for this deployment (None: none, or no scraper)."""
        if self.decode_bindings is None:
            return None
        meta = body["metadata"]
        return self.decode_bindings(meta["namespace"], meta["name"])

    def _write_status(self, body, previous: dict[str, Any], status: dict[str, Any]) -> bool:
        comparable = {k: v for k, v in previous.items() if k in status}
        if comparable == status and set(previous) <= set(status):
            return False
        meta = body["metadata"]
        # Keys that disappeared are removed explicitly (merge patch semantics).
        patch = {**{k: None for k in previous if k not in status}, **status}
        self._wrote(KIND, self.kube.patch_status(meta["namespace"], meta["name"], patch))
        for kind, reason, message in transitions(previous, status):
            self.kube.event(body, kind, reason, message)
        return True

    def _ensure_kv_token(self, owner: Owner) -> None:
        """Creates the KV token Secret with a fresh value unless it exists (then its value stays:
        it is never rotated by a reconcile). The value is never logged."""
        if self.kube.create_if_absent(SECRET, kv_token.secret(owner, secrets.token_urlsafe(32))):
            log.info("%s/%s: created the KV token Secret %s", owner.namespace, owner.name,
                     kv_token.secret_name(owner))

    def _first_apply(self, owner: Owner, rendered: Rendered, token_ensured: bool
                     ) -> tuple[list[str], list[dict[str, Any]]]:
        """The first reconcile of an object: applies every desired child, reading none (see the
        module doc); returns what it applied and the Deployments as applied."""
        applied, deployments = [], []
        for manifest in rendered.children:
            kind_name, name = manifest["kind"], manifest["metadata"]["name"]
            if kind_name == "Deployment" and rendered.kv_token_secret and not token_ensured:
                self._ensure_kv_token(owner)  # before pods that mount it
                token_ensured = True
            current = self.kube.apply(manifest)
            self._wrote(kind_name, current, manifest)
            applied.append(f"{kind_name}/{name}")
            if kind_name == "Deployment":
                self._offer(kind_name, current)
                deployments.append(current)
        log.info("%s/%s: first reconcile applied %s", owner.namespace, owner.name, applied)
        return applied, deployments

    @staticmethod
    def _by_component(deployments: list[dict[str, Any]]
                      ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        by = {d["metadata"]["labels"].get(LABEL_COMPONENT): d for d in deployments}
        return by.get("prefill"), by.get("decode")

    def _sync_children(self, owner: Owner, rendered: Rendered, token_ensured: bool,
                       read_all: bool = True
                       ) -> tuple[list[str], list[str], list[dict[str, Any]]]:
        """Applies what differs and prunes what is no longer desired; returns the live
        Deployments too (re-read when one was applied, for their status). Unless `read_all`,
        a child of SEEN_KINDS unchanged since this operator applied it is not read.

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
            manifest = desired.get(key)
            if manifest is not None and not read_all and self._unchanged_since_applied(manifest):
                continue
            current = self._live(kind, owner.namespace, name, manifest is not None, read_all)
            if manifest is not None:
                # A GET's object carries apiVersion/kind; compare the rendered fields only.
                if current is None or not is_subset(manifest, current):
                    if kind_name == "Deployment" and rendered.kv_token_secret \
                            and not token_ensured:
                        self._ensure_kv_token(owner)  # before pods that mount it
                        token_ensured = True
                    current = self.kube.apply(manifest)
                    self._wrote(kind_name, current, manifest)
                    self._offer(kind_name, current)
                    applied.append(f"{kind_name}/{name}")
                else:
                    self._verified(kind_name, current, manifest)
                if kind_name == "Deployment":
                    deployments.append(current)
            elif current is not None:
                refs = current["metadata"].get("ownerReferences", []) or []
                if any(r.get("uid") == owner.uid for r in refs):
                    self.kube.delete(kind, owner.namespace, name)
                    self.forget(kind_name, owner.namespace, name)
                    pruned.append(f"{kind_name}/{name}")
        if applied or pruned:
            log.info("%s/%s: applied %s, pruned %s", owner.namespace, owner.name, applied,
                     pruned)
        return applied, pruned, deployments

    def _release_held_rollouts(self, body: dict[str, Any], deployments: list[dict[str, Any]]
                               ) -> None:
        """Releases a tier's rollout that the controller-manager holds for good (rollout.py).
        The ReplicaSets are listed only for a Deployment whose own status allows it, so a
        Deployment that has rolled out costs no read. A hold is confirmed on fresh reads of the
        Deployment and its ReplicaSets before the write: the Deployment may come from the watch
        cache, and a count from before a `kubectl scale` must not be written. Best effort: a
        failed read or write is logged (once per Deployment and kind of failure) and the next
        reconcile tries again; the reconcile goes on. A confirmed hold that cannot be released
        (an old chart's ClusterRole without ReplicaSets) is also a Warning Event, once."""
        namespace = body["metadata"]["namespace"]
        for deployment in deployments:
            if not may_be_held(deployment):
                continue
            name = deployment["metadata"]["name"]
            try:
                held = held_rollout(deployment, self.kube.replica_sets(
                    namespace, deployment["spec"]["selector"].get("matchLabels") or {}))
                if held is not None:
                    fresh = self.kube.get(DEPLOYMENT, namespace, name, consistent=True)
                    held = fresh and held_rollout(fresh, self.kube.replica_sets(
                        namespace, fresh["spec"]["selector"].get("matchLabels") or {},
                        consistent=True))
            except Exception as error:   # best effort, see above
                self._warn_once(body, name, _failure(error), error)
                continue
            if not held:
                continue
            what = (f"Deployment {name}: kube-controller-manager held its rollout (ReplicaSet "
                    f"{held.replica_set} annotated desired-replicas {held.stale_desired}, the "
                    f"Deployment wants {held.annotations[DESIRED_REPLICAS]}: "
                    f"kubernetes/kubernetes#102551)")
            try:
                self.kube.annotate(REPLICA_SET, namespace, held.replica_set,
                                   held.resource_version, held.annotations)
            except Exception as error:   # best effort, see above
                # 404/409: the ReplicaSet went or changed; the controller is acting.
                if not (isinstance(error, ApiError) and error.status in (404, 409)) \
                        and self._warn_once(body, name, _failure(error), error):
                    self.kube.event(body, "Warning", "RolloutHeld", (
                        f"{what}; the operator could not release it: {error}. Its ClusterRole "
                        f"needs list and patch of replicasets.apps (the chart grants them); or "
                        f"set that annotation to the Deployment's replicas by hand"))
                continue
            component = (deployment["metadata"].get("labels") or {}).get(LABEL_COMPONENT, "")
            self.rollouts_released.labels(component).inc()
            message = f"{what}; released by updating the annotation"
            log.warning("%s/%s: %s", namespace, body["metadata"]["name"], message)
            self.kube.event(body, "Normal", "RolloutReleased", message)

    def _warn_once(self, body: dict[str, Any], deployment: str, failure: str,
                   error: Exception) -> bool:
        """A failed check or release of a held rollout, logged the first time it happens to
        that Deployment (an old chart's RBAC without ReplicaSets would log at every rollout).
        True when this was the first time."""
        key = (body["metadata"]["namespace"], deployment, failure)
        if key in self._release_failures:
            return False
        self._release_failures.add(key)
        log.warning("%s/%s: could not check or release the rollout of Deployment %s "
                    "(logged once): %s", key[0], body["metadata"]["name"], deployment, error)
        return True

    def _offer(self, kind_name: str, written: dict[str, Any]) -> None:
        if self.caches is not None:
            self.caches.offer(kind_name, written)

    def _live(self, kind: Kind, namespace: str, name: str, desired: bool, read_all: bool
              ) -> dict[str, Any] | None:
        """A child as it is: from the watch-fed cache where that answers the question (whether
        it exists; for a desired one, its fields, which only the Deployments' cache holds),
        else from the API. A child this operator wrote that the cache does not have yet is
        read (its watch event is on the way; an apply now would be a needless write)."""
        if not read_all and self.caches is not None:
            known, cached = self.caches.child(kind.kind, namespace, name)
            if known:
                if cached is None and (kind.kind, namespace, name) not in self._own_versions:
                    return None
                if cached is not None and (not desired or kind.kind == "Deployment"):
                    return cached
        return self.kube.get(kind, namespace, name)

    def _observe(self, owner: Owner, spec: InferenceDeploymentSpec, facts: ClusterFacts,
                 listed: list[dict[str, Any]], read_all: bool = True) -> Observed:
        prefill, decode = self._by_component(listed)
        caches = None if read_all else self.caches
        slices = caches.owned("EndpointSlice", owner.namespace, owner.name) if caches else None
        if slices is None:
            slices = self.kube.endpoint_slices(owner.namespace, owner.name)
        ready_endpoints = sum(
            1 for s in slices
            if (s["metadata"].get("labels") or {}).get(SERVICE_NAME) == owner.name
            for e in s.get("endpoints", []) or []
            if (e.get("conditions") or {}).get("ready"))
        # Both tiers' pods (the watch-fed cache, else one LIST from the apiserver's watch
        # cache): the decode pods' nodes for the NUMA plans, and every pod's scheduling and
        # container state for why a tier is not ready.
        cached = caches.owned("Pod", owner.namespace, owner.name) if caches else None
        pods = tuple(cached if cached is not None else self.kube.pods(
            owner.namespace, f"{LABEL_OWNER}={owner.name},{LABEL_COMPONENT} in (prefill,decode)"))
        decode_pods = tuple(
            (p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods
            if spec.decode and (p["metadata"].get("labels") or {}).get(LABEL_COMPONENT) == "decode"
            and p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp"))
        return Observed(prefill, decode, ready_endpoints, decode_pods, facts, pods)
