"""Peering: kopf's rule for who acts, when the keep-alives that outrank a replica lapse, and
the hand-over task that acts on the lapse (not at the next periodic resync)."""

from __future__ import annotations

import asyncio
import datetime as dt
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter

from heteroserve_operator.handlers import _handover
from heteroserve_operator.peering import Peering, PeeringGate, outranked_until
from heteroserve_operator.settings import OperatorSettings

NOW = dt.datetime(2026, 12, 6, 12, 0, 0, tzinfo=dt.UTC)


def keepalive(priority: int, seen_ago: float, lifetime: int = 20,
              now: dt.datetime = NOW) -> dict:
    seen = now - dt.timedelta(seconds=seen_ago)
    return {"priority": priority, "lifetime": lifetime,
            "lastseen": seen.isoformat().replace("+00:00", "Z")}


def test_outranked_until_is_the_last_lapse_of_a_live_peer_at_least_our_priority():
    peers = {
        "me": keepalive(100, 0),
        "higher": keepalive(200, 5),           # lapses in 15 s
        "tie": keepalive(100, 12),             # a tie pauses too (kopf): lapses in 8 s
        "lower": keepalive(50, 0),             # never outranks
        "dead": keepalive(300, 25),            # lapsed 5 s ago
        "no-keepalive": {"priority": 999},     # no lastseen: not a live peer
        "junk": "not a dict",
    }
    assert outranked_until(peers, "me", 100, NOW) == NOW + dt.timedelta(seconds=15)
    del peers["higher"]
    assert outranked_until(peers, "me", 100, NOW) == NOW + dt.timedelta(seconds=8)
    del peers["tie"]
    assert outranked_until(peers, "me", 100, NOW) is None
    assert outranked_until({}, "me", 100, NOW) is None
    # A lastseen without a zone is UTC, as kopf writes it.
    naive = {"other": {"priority": 200, "lifetime": 20, "lastseen": "2026-12-06T11:59:50"}}
    assert outranked_until(naive, "me", 100, NOW) == NOW + dt.timedelta(seconds=10)


class FakeKube:
    """The peering object's status, read by GET; the InferenceDeployments, listed."""

    def __init__(self, peers: dict, owners: list[tuple[str, str]] | None = None):
        self.peers, self.owners = peers, owners or []
        self.reads, self.fail_reads, self.fail_lists = 0, False, 0

    def request(self, method: str, path: str) -> dict:
        assert method == "GET" and path.endswith("/clusterkopfpeerings/ha")
        self.reads += 1
        if self.fail_reads:
            raise ConnectionError("apiserver away")
        return {"status": self.peers}

    def list_all_owners(self) -> list[tuple[str, str]]:
        if self.fail_lists:
            self.fail_lists -= 1
            raise ConnectionError("apiserver away")
        return list(self.owners)


def live(priority: int, lapse_in: float) -> dict:
    """A keep-alive (lifetime 20 s) that lapses `lapse_in` seconds from now."""
    return keepalive(priority, 20 - lapse_in, now=dt.datetime.now(dt.UTC))


def test_gate_caches_for_its_ttl_reads_fresh_on_demand_and_knows_the_lapse():
    kube = FakeKube({"other": live(200, 15)})
    gate = PeeringGate(kube, Peering("ha", "me", 100), ttl=60)
    assert gate.active() is False
    assert 14 < gate.lapse_in() <= 15
    kube.peers = {}
    assert gate.active() is False and kube.reads == 1          # cached
    assert gate.active(fresh=True) is True and kube.reads == 2
    assert gate.lapse_in() is None
    kube.fail_reads = True                                      # unreadable: do not act
    assert gate.active(fresh=True) is False and gate.lapse_in() is None
    assert PeeringGate(kube, None).active() is True             # no peering: always


def memo_for(kube: FakeKube, lifetime: int = 20) -> SimpleNamespace:
    queued: list[tuple[str, str]] = []
    return SimpleNamespace(
        gate=PeeringGate(kube, Peering("ha", "me", 100)),
        settings=OperatorSettings(peering_lifetime_seconds=lifetime),
        queue=SimpleNamespace(add=lambda namespace, name: queued.append((namespace, name))),
        reconciler=SimpleNamespace(kube=kube),
        handovers=Counter("handovers", "", registry=CollectorRegistry()),
        queued=queued)


async def run_until(memo: SimpleNamespace, done, timeout: float) -> float:
    """Runs the hand-over task until `done()`; returns the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(_handover(memo))
    try:
        while not done():
            assert loop.time() - started < timeout, "no hand-over"
            await asyncio.sleep(0.02)
        return loop.time() - started
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_a_passive_replica_takes_over_when_the_keepalive_lapses_and_queues_everything():
    owners = [("a", "one"), ("b", "two")]
    kube = FakeKube({"other": live(200, 0.5)}, owners)
    memo = memo_for(kube)   # half a lifetime is 10 s: a hand-over in ~0.75 s is the lapse's
    took = asyncio.run(run_until(memo, lambda: memo.handovers._value.get() == 1, timeout=5))
    assert 0.5 <= took < 5
    assert memo.queued == owners


async def next_look(kube: FakeKube, within: float) -> None:
    """Until the next read of the peering object (failing after `within` seconds)."""
    loop = asyncio.get_running_loop()
    reads, started = kube.reads, loop.time()
    while kube.reads == reads:
        assert loop.time() - started < within, "the hand-over task stopped looking"
        await asyncio.sleep(0.01)


def test_a_renewed_keepalive_keeps_the_replica_passive():
    kube = FakeKube({"other": live(200, 0.5)}, [("a", "one")])
    memo = memo_for(kube)

    async def renew_three_times_then_leave() -> list[float]:
        waiter = asyncio.create_task(run_until(
            memo, lambda: memo.handovers._value.get() == 1, timeout=10))
        handovers_at_looks = []
        for _ in range(3):
            await next_look(kube, within=5)
            handovers_at_looks.append(memo.handovers._value.get())
            # The peer renews just after each look, 1.5 s ahead: the next look (0.25 s after
            # the lapse seen) finds the renewal, live for another 0.5 s or more.
            kube.peers = {"other": live(200, 1.5)}
        kube.peers = {}   # then it leaves
        await waiter
        return handovers_at_looks

    # Passive at every look while renewed; one hand-over once it left, everything queued once.
    assert asyncio.run(renew_three_times_then_leave()) == [0, 0, 0]
    assert memo.handovers._value.get() == 1
    assert memo.queued == [("a", "one")]


def test_a_failed_listing_is_retried_and_an_active_replica_never_hands_over():
    kube = FakeKube({"other": live(200, 0.2)}, [("a", "one")])
    kube.fail_lists = 1
    memo = memo_for(kube)
    asyncio.run(run_until(memo, lambda: memo.handovers._value.get() == 1, timeout=8))
    assert memo.queued == [("a", "one")]      # queued once, by the retry

    kube = FakeKube({}, [("a", "one")])       # active from the start: nothing to take over
    memo = memo_for(kube, lifetime=1)         # looks every 0.5 s

    async def looks(n: int) -> None:
        task = asyncio.create_task(_handover(memo))
        for _ in range(n):
            await next_look(kube, within=5)
        task.cancel()

    asyncio.run(looks(4))
    assert memo.handovers._value.get() == 0 and memo.queued == []
