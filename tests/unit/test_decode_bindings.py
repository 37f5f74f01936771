"""status.decodeBindings: decode engines from pods and their entries (decode_bindings.py), the
scraper that reads the engines' /metrics and writes the entries only when they change
(binding_scraper.py, over httpx's MockTransport and a fake API), and the reconcile's status
carrying the field over (status.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from heteroserve_engines.protocol.binding_report import METRIC, ReportedBinding
from heteroserve_operator.api.models import InferenceDeploymentSpec
from heteroserve_operator.binding_scraper import BindingScraper, ScrapeSettings
from heteroserve_operator.decode_bindings import (
    Learned,
    adopt,
    decode_engine,
    entries,
    retry_delay,
)
from heteroserve_operator.kube import ApiError
from heteroserve_operator.reconcile import cluster_facts
from heteroserve_operator.render.children import render
from heteroserve_operator.render.meta import Owner
from heteroserve_operator.status import compute_status
from tests.cluster.catalogue import load_catalogue

STARTED = "2026-11-26T20:00:00Z"
OWNER = ("ns", "llm")


def pod(name: str = "llm-decode-a", *, component: str = "decode", node: str | None = "n1",
        ip: str | None = "10.0.0.5", port: int = 8000, started: str | None = STARTED,
        ready: bool = True, owner: str = "llm", deleting: bool = False,
        container: str = "engine", port_name: str = "engine") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {
        "heteroserve.io/inference-deployment": owner, "app.kubernetes.io/component": component}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T21:00:00Z"
    spec: dict[str, Any] = {"containers": [
        {"name": container, "ports": [{"name": port_name, "containerPort": port}]},
        {"name": "router", "ports": [{"name": "http", "containerPort": 8010}]}]}
    if node:
        spec["nodeName"] = node
    state = {"running": {"startedAt": started}} if started else {"waiting": {}}
    status: dict[str, Any] = {"containerStatuses": [
        {"name": container, "ready": ready, "state": state},
        {"name": "router", "ready": True, "state": {"running": {"startedAt": "x"}}}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": spec, "status": status}


def report(cpus: str = "0-3", nodes: str = "0", threads: int = 4) -> str:
    return ('vllm:num_requests_running{model_name="m"} 0.0\n'
            f'{METRIC}{{cpus="{cpus}",numa_nodes="{nodes}",threads="{threads}"}} 1.0\n')


SAMPLES = Path(__file__).resolve().parents[2] / "crds" / "samples"


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.yaml")))
def test_every_samples_engine_pods_have_no_api_token_and_a_readable_engine(sample):
    """The premise: no engine pod can tell the API server what it bound, so the operator reads
    it; and every decode engine rendered is one that decode_engine() finds, with its port."""
    document = yaml.safe_load((SAMPLES / f"{sample}.yaml").read_text())
    facts = cluster_facts([n.node_manifest() for n in load_catalogue()],
                          [n.topology_manifest() for n in load_catalogue()])
    owner = Owner(document["metadata"]["name"], "ns", "u")
    rendered = render(InferenceDeploymentSpec.model_validate(document["spec"]), owner, facts)
    engines = []
    for deployment in (c for c in rendered.children if c["kind"] == "Deployment"):
        template = deployment["spec"]["template"]
        assert template["spec"]["automountServiceAccountToken"] is False
        assert not any("projected" in v for v in template["spec"].get("volumes", []))
        names = [c["name"] for c in template["spec"]["containers"]]
        live = {"metadata": {**template["metadata"], "name": "p", "namespace": "ns"},
                "spec": {**template["spec"], "nodeName": "n"},
                "status": {"podIP": "10.0.0.1", "containerStatuses": [
                    {"name": n, "ready": True, "state": {"running": {"startedAt": "t"}}}
                    for n in names]}}
        engine = decode_engine(live)
        if engine is not None:
            assert engine.owner == owner.name and engine.metrics_url().startswith(
                "http://10.0.0.1:")
            engines.append(engine)
    assert len(engines) == (0 if document["spec"].get("decode") is None else 1)


# -- the pure part ----------------------------------------------------------------------------
def test_decode_engine_from_a_decode_pod_and_a_same_node_prefill_pod():
    engine = decode_engine(pod())
    assert (engine.owner_key, engine.pod, engine.node, engine.key) == (
        OWNER, "llm-decode-a", "n1", ("ns", "llm-decode-a", STARTED))
    assert engine.metrics_url() == "http://10.0.0.5:8000/metrics"
    shared = decode_engine(pod("llm-prefill-a", component="prefill", container="decode-engine",
                               port_name="decode", port=8001, ip="fd00::5"))
    assert shared.metrics_url() == "http://[fd00::5]:8001/metrics"
    # A prefill pod without a decode engine, an unscheduled or terminating pod: no engine.
    assert decode_engine(pod(component="prefill")) is None
    assert decode_engine(pod(node=None)) is None
    assert decode_engine(pod(deleting=True)) is None
    assert decode_engine(pod(component="router")) is None


def test_only_a_running_ready_engine_with_an_address_is_read():
    assert decode_engine(pod(ready=False)).metrics_url() is None
    assert decode_engine(pod(started=None)).metrics_url() is None
    assert decode_engine(pod(ip=None)).metrics_url() is None


def test_entries_by_state_and_pod_name():
    a, b, c = (decode_engine(pod(f"llm-decode-{x}")) for x in "abc")
    learned = {a.key: Learned(ReportedBinding((4, 5, 6, 7), (1,), 4)), b.key: Learned(None)}
    assert entries([c, b, a], learned) == [
        {"pod": "llm-decode-a", "node": "n1", "state": "Reported", "cpus": "4-7", "threads": 4,
         "numaNodes": [1], "engineStartedAt": STARTED},
        {"pod": "llm-decode-b", "node": "n1", "state": "NotReported",
         "engineStartedAt": STARTED},
        {"pod": "llm-decode-c", "node": "n1", "state": "Unknown"}]


def test_adopt_trusts_the_status_for_the_same_engine_start_only():
    engine = decode_engine(pod())
    reported = entries([engine], {engine.key: Learned(ReportedBinding((0, 1), (0,), 2))})
    assert adopt(reported, engine) == Learned(ReportedBinding((0, 1), (0,), 2))
    restarted = decode_engine(pod(started="2026-11-26T20:05:00Z"))
    assert adopt(reported, restarted) is None
    assert adopt(entries([engine], {}), engine) is None                     # Unknown
    assert adopt(entries([engine], {engine.key: Learned(None)}), engine) == Learned(None)
    assert adopt([{**reported[0], "cpus": "3-1"}], engine) is None          # not a CPU list
    assert adopt(None, engine) is None


def test_retry_delay_doubles_up_to_the_cap():
    assert [retry_delay(n, 5, 60) for n in (1, 2, 3, 4, 5, 9)] == [5, 10, 20, 40, 60, 60]


def test_the_reconcile_status_carries_decode_bindings_over():
    bindings = [{"pod": "p", "node": "n", "state": "Unknown"}]
    status = compute_status(None, 3, {"decodeBindings": bindings}, "now",
                            error=("InvalidSpec", "x"))
    assert status["decodeBindings"] == bindings
    assert "decodeBindings" not in compute_status(None, 3, {}, "now", error=("InvalidSpec", "x"))


def test_the_reconcile_status_writes_the_scrapers_published_entries():
    """The scraper's entries replace the status's own; none published removes the field."""
    old = [{"pod": "p", "node": "n", "state": "Unknown"}]
    new = [{"pod": "p", "node": "n", "state": "NotReported", "engineStartedAt": STARTED}]
    status = compute_status(None, 3, {"decodeBindings": old}, "now", error=("X", "y"),
                            decode_bindings=new)
    assert status["decodeBindings"] == new
    assert "decodeBindings" not in compute_status(
        None, 3, {"decodeBindings": old}, "now", error=("X", "y"), decode_bindings=[])


# -- the scraper ------------------------------------------------------------------------------
class FakeKube:
    """patch_status applied as a merge patch of the status (enough for one list field)."""

    def __init__(self):
        self.status: dict[str, Any] = {}
        self.patches: list[dict[str, Any]] = []
        self.pod_list: list[dict[str, Any]] = []
        self.lists = 0
        self.fail_with: ApiError | None = None

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        assert (namespace, selector) == ("ns", "heteroserve.io/inference-deployment=llm")
        if self.fail_with:
            raise self.fail_with
        self.lists += 1
        return self.pod_list

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        assert (namespace, name) == OWNER
        self.patches.append(patch)
        for key, value in patch.items():
            if value is None:
                self.status.pop(key, None)
            else:
                self.status[key] = value
        return {"metadata": {"namespace": namespace, "name": name,
                             "resourceVersion": str(100 + len(self.patches))},
                "status": dict(self.status)}

    def body(self) -> dict[str, Any]:
        return {"metadata": {"namespace": "ns", "name": "llm"}, "status": dict(self.status)}


class Gate:
    open = True

    def active(self) -> bool:
        return self.open


class Engines:
    """The engines' /metrics behind httpx's MockTransport: url -> answer."""

    def __init__(self):
        self.answers: dict[str, Any] = {}
        self.requests: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(str(request.url))
        answer = self.answers.get(str(request.url))
        if isinstance(answer, Exception):
            raise answer
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        status, text = answer
        return httpx.Response(status, text=text)


class Rig:
    """The scraper, with the part of a reconcile it relies on: a reconcile it asks for writes
    the entries it published (status.py's decode_bindings) when they differ from the status."""

    def __init__(self, settings: ScrapeSettings | None = None):
        self.kube, self.gate, self.engines = FakeKube(), Gate(), Engines()
        self.requested: list[tuple[str, str]] = []
        self.scraper = BindingScraper(self.kube, self.gate, settings=settings,
                                      transport=httpx.MockTransport(self.engines),
                                      request_reconcile=self.reconcile)

    def reconcile(self, namespace: str, name: str) -> None:
        self.requested.append((namespace, name))
        status = compute_status(None, 1, dict(self.kube.status), "now", error=("X", "y"),
                                decode_bindings=self.scraper.entries_for(namespace, name))
        if status.get("decodeBindings") != self.kube.status.get("decodeBindings"):
            self.kube.patch_status(namespace, name,
                                   {"decodeBindings": status.get("decodeBindings")})

    def pods(self, *pods: dict[str, Any], list_too: bool = True) -> None:
        for p in pods:
            self.scraper.pod_event(p, "MODIFIED")
        if list_too:
            self.kube.pod_list = list(pods)

    def owner(self) -> None:
        self.scraper.owner_event(self.kube.body(), "MODIFIED")

    def step(self) -> None:
        async def once():
            async with httpx.AsyncClient(transport=self.scraper.transport) as client:
                await self.scraper.step(client, asyncio.Semaphore(4))

        asyncio.run(once())


URL = "http://10.0.0.5:8000/metrics"


def test_learned_once_per_engine_start_and_written_only_on_change():
    rig = Rig()
    rig.owner()
    rig.pods(pod(ready=False))
    rig.step()
    assert rig.kube.status["decodeBindings"] == [
        {"pod": "llm-decode-a", "node": "n1", "state": "Unknown"}]
    assert rig.engines.requests == []            # not ready: not read
    rig.owner()                                  # the write's own watch event
    rig.engines.answers[URL] = (200, report("2-3", "0", 2))
    rig.pods(pod())
    rig.step()
    assert rig.kube.status["decodeBindings"] == [
        {"pod": "llm-decode-a", "node": "n1", "state": "Reported", "cpus": "2-3", "threads": 2,
         "numaNodes": [0], "engineStartedAt": STARTED}]
    assert rig.engines.requests == [URL] and len(rig.kube.patches) == 2
    rig.owner()
    # Unchanged: more events (a label, the reconcile's own status writes) and steps read and
    # write nothing.
    for _ in range(3):
        rig.pods(pod())
        rig.owner()
        rig.step()
    assert rig.engines.requests == [URL] and len(rig.kube.patches) == 2
    # The container restarts: the new start is read again.
    rig.engines.answers[URL] = (200, report("0-1", "0", 2))
    rig.pods(pod(started="2026-11-26T20:09:00Z"))
    rig.step()
    assert rig.kube.status["decodeBindings"][0]["cpus"] == "0-1"
    assert rig.engines.requests == [URL, URL]
    # What the first start reported is forgotten; nothing is left to read.
    assert list(rig.scraper.learned) == [("ns", "llm-decode-a", "2026-11-26T20:09:00Z")]
    assert not rig.scraper._unread
    # The pod goes: its entry too, and the field with the last one.
    rig.owner()
    rig.scraper.pod_event(pod(started="2026-11-26T20:09:00Z"), "DELETED")
    rig.kube.pod_list = []
    rig.step()
    assert "decodeBindings" not in rig.kube.status and rig.kube.patches[-1] == {
        "decodeBindings": None}
    assert not rig.scraper.learned and not rig.scraper.engines and not rig.scraper._unread


def test_an_engine_without_the_metric_or_without_metrics_is_not_reported():
    rig = Rig()
    rig.owner()
    other = pod("llm-decode-b", ip="10.0.0.6")
    rig.engines.answers[URL] = (200, 'vllm:num_requests_running{model_name="m"} 0.0\n')
    rig.engines.answers["http://10.0.0.6:8000/metrics"] = (404, "not found")
    rig.pods(pod(), other)
    rig.step()
    assert [e["state"] for e in rig.kube.status["decodeBindings"]] == ["NotReported"] * 2


def test_a_failing_engine_is_retried_with_back_off_and_written_once():
    rig = Rig(ScrapeSettings(retry_first_seconds=30))
    rig.owner()
    rig.engines.answers[URL] = httpx.ReadTimeout("slow")
    rig.pods(pod())
    for _ in range(3):
        rig.step()
        rig.owner()
    assert rig.engines.requests == [URL]       # the retry is 30 s away
    assert rig.kube.patches == [{"decodeBindings": [
        {"pod": "llm-decode-a", "node": "n1", "state": "Unknown"}]}]
    assert rig.scraper.scrapes.labels("failed")._value.get() == 1
    # A new address (the pod's IP changed) is read at once.
    rig.engines.answers["http://10.0.0.9:8000/metrics"] = (200, report("1", "0", 1))
    rig.pods(pod(ip="10.0.0.9"))
    rig.step()
    assert rig.kube.status["decodeBindings"][0]["cpus"] == "1"


def test_a_malformed_report_counts_as_a_failed_read():
    rig = Rig()
    rig.owner()
    rig.engines.answers[URL] = (200, f'{METRIC}{{cpus="9-2",numa_nodes="0",threads="1"}} 1\n')
    rig.pods(pod())
    rig.step()
    assert rig.kube.status["decodeBindings"][0]["state"] == "Unknown"
    assert rig.scraper.scrapes.labels("failed")._value.get() == 1


def test_a_restarted_operator_adopts_the_status_and_neither_reads_nor_writes():
    first = Rig()
    first.owner()
    first.engines.answers[URL] = (200, report())
    first.pods(pod())
    first.step()
    assert first.kube.status["decodeBindings"][0]["state"] == "Reported"
    second = Rig()
    second.kube.status = dict(first.kube.status)
    # Start-up order is not guaranteed: the deployment's listing may come before its pods'.
    second.kube.pod_list = [pod()]
    second.owner()
    second.step()
    second.pods(pod())
    second.step()
    assert second.engines.requests == [] and second.kube.patches == []


def test_a_deployment_seen_before_its_pods_is_not_written_from_half_an_index():
    rig = Rig()
    rig.kube.status = {"decodeBindings": [
        {"pod": "llm-decode-a", "node": "n1", "state": "Unknown"}]}
    rig.kube.pod_list = [pod(ready=False)]
    rig.owner()
    rig.step()                       # the index is empty; the LIST finds the pod
    assert rig.kube.patches == [] and rig.kube.lists == 1


def test_entries_changed_elsewhere_are_written_again():
    """Entries that another writer changed (a hand edit of the status, an older operator
    replica) are seen in the deployment's event; the scraper asks for a reconcile, which writes
    its entries again."""
    rig = Rig()
    rig.owner()
    rig.engines.answers[URL] = (200, report())
    rig.pods(pod())
    rig.step()
    written = rig.kube.status["decodeBindings"]
    rig.kube.status["decodeBindings"] = [{"pod": "llm-decode-a", "node": "n1",
                                          "state": "Unknown"}]
    rig.owner()
    rig.step()
    assert rig.kube.status["decodeBindings"] == written and len(rig.kube.patches) == 2


def test_a_paused_replica_reads_and_writes_nothing():
    rig = Rig()
    rig.gate.open = False
    rig.owner()
    rig.engines.answers[URL] = (200, report())
    rig.pods(pod())
    rig.step()
    assert rig.engines.requests == [] and rig.kube.patches == []
    rig.gate.open = True
    rig.step()
    assert rig.kube.status["decodeBindings"][0]["state"] == "Reported"
    # Paused again (another replica took over): nothing it published earlier is handed to a
    # reconcile any more; the status's own entries are carried until it publishes afresh.
    assert rig.scraper.entries_for(*OWNER) is not None
    rig.gate.open = False
    rig.step()
    assert rig.scraper.entries_for(*OWNER) is None


@pytest.mark.parametrize("status", [429, 500])
def test_a_failed_listing_of_the_pods_is_retried_and_nothing_is_published_meanwhile(status):
    rig = Rig()
    rig.owner()
    rig.engines.answers[URL] = (200, report())
    rig.pods(pod())
    rig.kube.fail_with = ApiError(status, "no")
    rig.step()
    assert rig.scraper.dirty == {OWNER}
    assert rig.scraper.entries_for(*OWNER) is None and rig.requested == []
    rig.kube.fail_with = None
    rig.step()
    assert rig.kube.status["decodeBindings"][0]["state"] == "Reported"
    assert rig.engines.requests == [URL] and rig.requested == [OWNER]


def test_the_loop_wakes_for_events_and_for_retries():
    """`run()` as the operator runs it: an event wakes it at once, a failed read is retried
    when its back-off is over, and nothing else happens while idle."""
    rig = Rig(ScrapeSettings(retry_first_seconds=0.3, settle_seconds=0.1))
    scraper = rig.scraper

    async def scenario():
        task = asyncio.create_task(scraper.run())
        try:
            async def until(predicate, timeout=5.0):
                deadline = asyncio.get_running_loop().time() + timeout
                while not predicate():
                    assert asyncio.get_running_loop().time() < deadline, rig.kube.patches
                    await asyncio.sleep(0.02)

            rig.owner()
            rig.pods(pod())                                  # refused: the engine loads
            await until(lambda: rig.kube.status.get("decodeBindings"))
            rig.owner()
            rig.engines.answers[URL] = (200, report("5", "0", 1))
            await until(lambda: rig.kube.status["decodeBindings"][0]["state"] == "Reported")
            assert rig.engines.requests == [URL, URL]
            rig.owner()
            await asyncio.sleep(1.0)                         # idle
            assert rig.engines.requests == [URL, URL] and len(rig.kube.patches) == 2
        finally:
            task.cancel()

    asyncio.run(scenario())


def test_the_scraper_writes_nothing_itself_and_asks_for_a_reconcile_only_on_a_change():
    """Its entries are written by the reconcile it queues (one writer of the status; a new
    deployment's entries usually ride in the write that reports its pods ready). The scraper
    has nothing to say of a deployment it has not seen (the reconcile keeps the status's own)."""
    rig = Rig()
    assert rig.scraper.entries_for(*OWNER) is None
    asked: list[tuple[str, str]] = []
    rig.scraper.request_reconcile = lambda namespace, name: asked.append((namespace, name))
    rig.owner()
    rig.pods(pod(ready=False))
    rig.step()
    assert asked == [OWNER] and rig.kube.patches == []
    assert rig.scraper.entries_for(*OWNER) == [
        {"pod": "llm-decode-a", "node": "n1", "state": "Unknown"}]
    # Once the status has them (the reconcile's write, seen in its event), events ask nothing.
    rig.kube.status["decodeBindings"] = rig.scraper.entries_for(*OWNER)
    rig.owner()
    rig.pods(pod(ready=False, ip="10.0.0.7"))
    rig.step()
    assert asked == [OWNER] and rig.kube.patches == []
    # A change asks again.
    rig.scraper.pod_event(pod(ready=False), "DELETED")
    rig.kube.pod_list = []
    rig.step()
    assert asked == [OWNER, OWNER] and rig.scraper.entries_for(*OWNER) == []


def test_many_deployments_are_published_in_one_pass():
    """A thousand new deployments: one pass publishes every dirty deployment's entries and
    queues each once, with no write and no listing (the pod cache answers)."""

    class Caches:
        def owned(self, kind, namespace, name):
            return [pod(f"{name}-decode-a", owner=name, ready=False)]

    class NoApi:
        def __getattr__(self, name):
            raise AssertionError(f"the scraper called the API: {name}")

    asked: list[tuple[str, str]] = []
    scraper = BindingScraper(NoApi(), Gate(), transport=httpx.MockTransport(Engines()),  # type: ignore[arg-type]
                             request_reconcile=lambda ns, n: asked.append((ns, n)))
    scraper.caches = Caches()  # type: ignore[assignment]
    names = [f"d{i}" for i in range(50)]
    for name in names:
        scraper.owner_event({"metadata": {"namespace": "ns", "name": name}, "status": {}},
                            "ADDED")
        scraper.pod_event(pod(f"{name}-decode-a", owner=name, ready=False), "ADDED")

    async def once():
        async with httpx.AsyncClient(transport=scraper.transport) as client:
            await scraper.step(client, asyncio.Semaphore(4))

    asyncio.run(once())
    assert sorted(asked) == sorted(("ns", n) for n in names)
    assert all(scraper.entries_for("ns", n)[0]["pod"] == f"{n}-decode-a" for n in names)
    assert not scraper.dirty


def test_each_deployments_engines_are_indexed_through_moves_and_deletions():
    """A deployment's entries come from its own engines (an index by owner, not a scan of
    every engine): a pod that is deleted, or relabelled to another deployment, leaves it."""
    rig = Rig()
    scraper = rig.scraper
    scraper.pod_event(pod("a-1", owner="a", ready=False), "ADDED")
    scraper.pod_event(pod("a-2", owner="a", ready=False), "ADDED")
    scraper.pod_event(pod("b-1", owner="b", ready=False), "ADDED")
    pods_of = lambda owner: [e["pod"] for e in scraper._wanted(("ns", owner))]  # noqa: E731
    assert pods_of("a") == ["a-1", "a-2"] and pods_of("b") == ["b-1"]
    scraper.pod_event(pod("a-2", owner="b", ready=False), "MODIFIED")   # relabelled
    assert pods_of("a") == ["a-1"] and pods_of("b") == ["a-2", "b-1"]
    scraper.pod_event(pod("a-1", owner="a"), "DELETED")
    assert pods_of("a") == [] and ("ns", "a") not in scraper._owned
    scraper._replace_engines(("ns", "b"), [pod("b-3", owner="b", ready=False)])
    assert pods_of("b") == ["b-3"] and set(scraper.engines) == {("ns", "b-3")}
