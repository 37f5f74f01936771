"""The one layer that talks to the API server. Everything else is pure.

Writes are server-side apply under one field manager, deletes for pruning, merge patches of the
status subresource, and Events; each is counted (`heteroserve_operator_api_writes_total`) so that
"no writes while idle" is measurable.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes.client import rest as k8s_rest
from prometheus_client import CollectorRegistry, Counter

from .api.models import GROUP, KIND, PLURAL, VERSION
from .render.meta import FIELD_MANAGER
from .settings import OperatorSettings

log = logging.getLogger(__name__)

NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str

    def collection(self, namespace: str) -> str:
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        return f"{prefix}/namespaces/{namespace}/{self.plural}"


# Every kind the operator creates, in apply order.
CHILD_KINDS = (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Kind("networking.k8s.io/v1", "Ingress", "ingresses"),
)
KINDS = {(k.api_version, k.kind): k for k in CHILD_KINDS}
# Created once and never read (the operator may create Secrets, not get, list or watch them).
SECRET = Kind("v1", "Secret", "secrets")
# Listed, and annotated, only to release a rollout the controller-manager holds (rollout.py).
REPLICA_SET = Kind("apps/v1", "ReplicaSet", "replicasets")
INFERENCE_DEPLOYMENT = Kind(f"{GROUP}/{VERSION}", KIND, PLURAL)


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeApi:
    """A thin, typed-enough client over kubernetes' ApiClient (its auth and TLS)."""

    def __init__(self, api_client: k8s.ApiClient, registry: CollectorRegistry | None = None,
                 connections: int = OperatorSettings.workers + 16):
        """`connections`: kept-alive connections to the apiserver, at least one per reconcile
        worker and per informer's watch (the client's default, 5 per CPU, would make workers
        beyond it open a new TLS connection per request)."""
        if (api_client.configuration.connection_pool_maxsize or 0) < connections:
            api_client.configuration.connection_pool_maxsize = connections
            api_client.rest_client = k8s_rest.RESTClientObject(api_client.configuration)
        self.api = api_client
        self.writes = Counter(
            "heteroserve_operator_api_writes", "Mutating requests sent to the API server",
            ["verb", "kind"], registry=registry)
        self.reads = Counter(
            "heteroserve_operator_api_reads", "Reading requests sent to the API server",
            ["kind"], registry=registry)

    # -- transport ---------------------------------------------------------------------------
    def _headers(self, accept: str) -> dict[str, str]:
        """Accept and the bearer token as the client's configuration gives it (the in-cluster
        configuration re-reads a rotated service account token through its refresh hook); a
        client certificate is the connection pool's."""
        headers = {"Accept": accept}
        token = self.api.configuration.auth_settings().get("BearerToken")
        if token and token.get("value"):
            headers[token["key"]] = token["value"]
        return headers

    def _url(self, path: str, query: list[tuple[str, str]] | None) -> str:
        return self.api.configuration.host + path + (f"?{urlencode(query)}" if query else "")

    def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        """One request through the client's connection pool, its body encoded by orjson.
        kubernetes' ApiClient (param_serialize, call_api) walked every body to sanitise it and
        encoded it with the standard library (tests/bench/kube_request_cpu.py measures both
        paths; writes are most of the operator's CPU, docs/benchmarks.md, operator scale)."""
        response = self._send(method, path, query, "application/json", 60,
                              body=body, content_type=content_type)
        return self._answer(response)

    def _send(self, method: str, path: str, query: list[tuple[str, str]] | None, accept: str,
              timeout: float | tuple[float, float], body: Any = None,
              content_type: str = "application/json"):
        """urllib3's response, its body not read (a WATCH's caller streams it). `timeout`: in
        all, or (connect, read)."""
        headers = self._headers(accept)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        return self.api.rest_client.pool_manager.request(
            method, self._url(path, query), body=data, headers=headers,
            timeout=(urllib3.Timeout(connect=timeout[0], read=timeout[1])
                     if isinstance(timeout, tuple) else urllib3.Timeout(total=timeout)),
            preload_content=False)

    @staticmethod
    def _answer(response) -> dict[str, Any]:
        """The decoded body of a response, the connection back in the pool; ApiError (with the
        apiserver's message when it sent a Status) for an error status."""
        try:
            data = response.read() or b"{}"
        finally:
            response.release_conn()
        if response.status >= 400:
            text = data.decode(errors="replace")
            try:
                message = orjson.loads(data).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise ApiError(response.status, message[:1000])
        return orjson.loads(data)

    def list_raw(self, kind: str, path: str, query: list[tuple[str, str]],
                 accept: str = "application/json") -> dict[str, Any]:
        """A LIST with a chosen representation (an informer's metadata-only listing)."""
        self.reads.labels(kind).inc()
        return self._answer(self._send("GET", path, query, accept, 60))

    def open_stream(self, path: str, query: list[tuple[str, str]], accept: str,
                    read_timeout: float):
        """A WATCH request; returns urllib3's response, its body not read (the caller streams
        it and releases the connection)."""
        response = self._send("GET", path, query, accept, (10, read_timeout))
        if response.status >= 400:
            self._answer(response)   # raises
        return response

    def _read(self, kind: str, path: str, query: list[tuple[str, str]] | None = None) -> dict:
        self.reads.labels(kind).inc()
        return self.request("GET", path, query=query)

    def _write(self, verb: str, kind: str, method: str, path: str, **kwargs) -> dict:
        self.writes.labels(verb, kind).inc()
        return self.request(method, path, **kwargs)

    # -- children ----------------------------------------------------------------------------
    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply under the operator's field manager (forcing conflicts: the
        operator owns its children's rendered fields)."""
        kind = KINDS[(manifest["apiVersion"], manifest["kind"])]
        meta = manifest["metadata"]
        path = f"{kind.collection(meta['namespace'])}/{quote(meta['name'])}"
        return self._write("apply", kind.kind, "PATCH", path,
                           query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
                           body=manifest, content_type="application/apply-patch+yaml")

    def create_if_absent(self, kind: Kind, manifest: dict[str, Any]) -> bool:
        """POST `manifest`; False when an object of that name exists already (left as it is).
        The answer is not returned: for a Secret it echoes the value."""
        try:
            self._write("create", kind.kind, "POST",
                        kind.collection(manifest["metadata"]["namespace"]), body=manifest)
        except ApiError as error:
            if error.status == 409:
                return False
            raise
        return True

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        try:
            self._write("delete", kind.kind, "DELETE",
                        f"{kind.collection(namespace)}/{quote(name)}",
                        body={"propagationPolicy": "Background"})
        except ApiError as error:
            if error.status != 404:
                raise

    def get(self, kind: Kind, namespace: str, name: str, consistent: bool = False
            ) -> dict[str, Any] | None:
        """One child by name, from the apiserver's watch cache (resourceVersion=0): O(1) and no
        etcd read. A read that lags the operator's own apply only causes an idempotent
        re-apply; an idle cluster's cache is current, so idleness stays write-free.
        `consistent`: the latest version instead (a read from etcd)."""
        try:
            return self._read(kind.kind, f"{kind.collection(namespace)}/{quote(name)}",
                              query=None if consistent else [("resourceVersion", "0")])
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    # Observations for status are LISTed from the apiserver's watch cache (resourceVersion=0):
    # filtering there is in memory, where a quorum LIST scans etcd.
    def pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self._read("Pod", f"/api/v1/namespaces/{namespace}/pods",
                          query=[("labelSelector", label_selector), ("resourceVersion", "0")]
                          ).get("items", [])

    def replica_sets(self, namespace: str, match_labels: dict[str, str],
                     consistent: bool = False) -> list[dict[str, Any]]:
        """The ReplicaSets a Deployment's selector (`match_labels`) matches, from the
        apiserver's watch cache; `consistent`: as they are now (a read from etcd)."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))
        query = [("labelSelector", selector)]
        if not consistent:
            query.append(("resourceVersion", "0"))
        return self._read(REPLICA_SET.kind, REPLICA_SET.collection(namespace),
                          query=query).get("items", [])

    def annotate(self, kind: Kind, namespace: str, name: str, resource_version: str,
                 annotations: dict[str, str]) -> dict[str, Any]:
        """Sets `annotations` on an object if it is still at `resource_version` (a merge patch
        that carries the resourceVersion is conditional: HTTP 409 when it moved on)."""
        return self._write("annotate", kind.kind, "PATCH",
                           f"{kind.collection(namespace)}/{quote(name)}",
                           body={"metadata": {"resourceVersion": resource_version,
                                              "annotations": annotations}},
                           content_type="application/merge-patch+json")

    def endpoint_slices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        return self._read(
            "EndpointSlice", f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            query=[("labelSelector", f"kubernetes.io/service-name={service}"),
                   ("resourceVersion", "0")]).get("items", [])

    # -- cluster facts -----------------------------------------------------------------------
    def nodes(self) -> list[dict[str, Any]]:
        return self._read("Node", "/api/v1/nodes").get("items", [])

    def node_resource_topologies(self) -> list[dict[str, Any]]:
        try:
            return self._read("NodeResourceTopology", NRT_PATH).get("items", [])
        except ApiError as error:
            if error.status == 404:  # CRD not installed: fall back to node labels
                return []
            raise

    # -- the InferenceDeployment ---------------------------------------------------------------
    def inference_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._read(KIND, f"{INFERENCE_DEPLOYMENT.collection(namespace)}/{name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list_all_owners(self) -> list[tuple[str, str]]:
        items = self._read(KIND, f"/apis/{GROUP}/{VERSION}/{PLURAL}").get("items", [])
        return [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in items]

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]
                     ) -> dict[str, Any]:
        """Returns the object as written (its resourceVersion identifies the write's echo)."""
        return self._write("patch-status", KIND, "PATCH",
                           f"{INFERENCE_DEPLOYMENT.collection(namespace)}/{name}/status",
                           body={"status": status}, content_type="application/merge-patch+json")

    def event(self, owner: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event on the InferenceDeployment (kubectl describe shows it)."""
        meta = owner["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": owner["apiVersion"], "kind": KIND,
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "type": kind, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._write("create", "Event", "POST",
                        f"/api/v1/namespaces/{meta['namespace']}/events", body=body)
        except ApiError as error:  # events are best effort
            log.warning("could not post event %s: %s", reason, error)
