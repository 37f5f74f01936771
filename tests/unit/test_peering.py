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

# Each test takes seconds; a hang fails in a minute, not at the suite's ten.
pytestmark = pytest.mark.timeout(60)

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
    """The peering object's status, read by GET (`peers`: a dict, or a function of the read's
    number from 1, called at the read); the InferenceDeployments, listed."""

    def __init__(self, peers, owners: list[tuple[str, str]] | None = None):
        self.peers, self.owners = peers, owners or []
        self.reads, self.fail_reads, self.fail_lists = 0, False, 0

    def request(self, method: str, path: str) -> dict:
        assert method == "GET" and path.endswith("/clusterkopfpeerings/ha")
        self.reads += 1
        if self.fail_reads:
            raise ConnectionError("apiserver away")
        return {"status": self.peers(self.reads) if callable(self.peers) else self.peers}

    def list_all_owners(self) -> list[tuple[str, str]]:
        if self.fail_lists:
            self.fail_lists -= 1
            raise ConnectionError("apiserver away")
        return list(self.owners)


def live(priority: int, lapse_in: float) -> dict:
    """A keep-alive (lifetime 20 s) that lapses `lapse_in` seconds from now."""
    return keepalive(priority, 20 - lapse_in, now=dt.datetime.now(dt.UTC))


def renewed_until(reads: int, lapse_in: float = 0.3):
    """A peer of priority 200 that renews its keep-alive (lapsing `lapse_in` s ahead) before
    each of the first `reads` reads, then dies: later reads find its last keep-alive, which
    lapses. Made at each read, so no margin depends on how fast the test starts."""
    last: dict = {}

    def peers(read: int) -> dict:
        if read <= reads:
            last["other"] = live(200, lapse_in)
        return dict(last)

    return peers


def test_gate_caches_for_its_ttl_reads_fresh_on_demand_and_knows_the_lapse():
    kube = FakeKube({"other": live(200, 15)})
    gate = PeeringGate(kube, Peering("ha", "me", 100), ttl=60)
    assert gate.active() is False
    assert 14 < gate.lapse_in() <= 15
    kube.peers = {}
    assert gate.active() is False and kube.reads == 1          # cached
    assert gate.active(fresh=True) is True and kube.reads == 2
    assert gate.lapse_in() is None and gate.takeovers == 1
    kube.fail_reads = True                                      # unreadable: do not act
    assert gate.active(fresh=True) is False and gate.lapse_in() is None
    kube.fail_reads = False                                     # a blip is not a take-over
    assert gate.active(fresh=True) is True and gate.takeovers == 1
    assert PeeringGate(kube, None).active() is True             # no peering: always


def test_gate_counts_takeovers_and_keeps_refused_keys_whoever_reads():
    kube = FakeKube({})
    gate = PeeringGate(kube, Peering("ha", "me", 100), ttl=0)
    changes = []
    gate.on_change = lambda: changes.append(gate.takeovers)
    assert gate.active() is True and gate.takeovers == 0 and changes == []   # active at start
    kube.peers = {"other": live(300, 15)}                       # a higher priority joins
    assert gate.active() is False
    gate.refused("ns", "a")
    kube.peers = {}                                             # and leaves
    assert gate.active() is True and gate.takeovers == 1 and changes == [1]
    kube.fail_reads = True                                      # a blip while active
    assert gate.active() is False
    gate.refused("ns", "b")
    kube.fail_reads = False
    assert gate.active() is True and gate.takeovers == 1 and changes == [1, 1]
    assert gate.take_refused() == {("ns", "a"), ("ns", "b")} and gate.take_refused() == set()
    assert gate.active() is True and changes == [1, 1]          # nothing new to act on


def memo_for(kube: FakeKube, lifetime: int = 20) -> SimpleNamespace:
    queued: list[tuple[str, str]] = []
    return SimpleNamespace(
        gate=PeeringGate(kube, Peering("ha", "me", 100)),
        settings=OperatorSettings(peering_lifetime_seconds=lifetime),
        queue=SimpleNamespace(add=lambda namespace, name: queued.append((namespace, name))),
        reconciler=SimpleNamespace(kube=kube),
        handovers=Counter("handovers", "", registry=CollectorRegistry()),
        queued=queued)


def handovers(memo: SimpleNamespace) -> float:
    return memo.handovers._value.get()


async def until(done, within: float, what: str) -> float:
    """Waits for `done()`; returns the seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not done():
        assert loop.time() - started < within, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return loop.time() - started


def with_handover(memo: SimpleNamespace, body) -> None:
    """Runs the hand-over task beside `body()` (a coroutine function), then cancels it."""

    async def run() -> None:
        task = asyncio.create_task(_handover(memo))
        try:
            await body()
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert memo.gate.on_change is None    # the task let go of the gate

    asyncio.run(run())


def test_a_passive_replica_takes_over_when_the_keepalive_lapses_and_queues_everything():
    owners = [("a", "one"), ("b", "two")]
    kube = FakeKube(renewed_until(reads=1), owners)
    memo = memo_for(kube)   # half a lifetime is 10 s: a hand-over within 5 s is the lapse's

    async def body() -> None:
        await until(lambda: handovers(memo) == 1, 5, "the hand-over")
        assert kube.reads == 2    # the start's read (outranked), then one 0.25 s after the lapse

    with_handover(memo, body)
    assert memo.queued == owners


def test_a_renewed_keepalive_keeps_the_replica_passive():
    kube = FakeKube(renewed_until(reads=3), [("a", "one")])
    memo = memo_for(kube)
    at_reads = []

    async def body() -> None:
        for read in (1, 2, 3):
            await until(lambda read=read: kube.reads >= read, 5, f"read {read}")
            at_reads.append(handovers(memo))
        await until(lambda: handovers(memo) == 1, 5, "the hand-over")

    with_handover(memo, body)
    # Passive at every renewed read; one hand-over at the fourth, everything queued once.
    assert at_reads == [0, 0, 0] and kube.reads == 4
    assert memo.queued == [("a", "one")]


def test_a_failed_listing_is_retried():
    kube = FakeKube(renewed_until(reads=1), [("a", "one")])
    kube.fail_lists = 1
    memo = memo_for(kube)

    async def body() -> None:
        await until(lambda: handovers(memo) == 1, 8, "the hand-over, retried")

    with_handover(memo, body)
    assert memo.queued == [("a", "one")] and kube.fail_lists == 0


def test_an_active_replica_paused_briefly_between_its_looks_acts_on_what_was_refused():
    # Half a lifetime is 10 s: the pause begins and ends between two of the task's looks, seen
    # only by a reconcile's reads, which wake the task.
    kube = FakeKube({}, [("a", "one"), ("b", "two")])
    memo = memo_for(kube)
    gate = memo.gate

    async def body() -> None:
        await until(lambda: kube.reads == 1, 5, "the task's first look")
        loop = asyncio.get_running_loop()
        kube.peers = {"other": live(300, 15)}            # a replica of higher priority joins
        assert await loop.run_in_executor(None, lambda: gate.active(fresh=True)) is False
        gate.refused("a", "one")                          # a reconcile refused meanwhile
        kube.peers = {}                                   # it leaves cleanly (lifetime 0)
        assert await loop.run_in_executor(None, lambda: gate.active(fresh=True)) is True
        await until(lambda: handovers(memo) == 1, 5, "the hand-over after the pause")

    with_handover(memo, body)
    assert memo.queued == [("a", "one"), ("b", "two")]


def test_an_active_replica_queues_again_what_an_unreadable_object_refused_not_a_handover():
    kube = FakeKube({}, [("a", "one"), ("b", "two")])
    memo = memo_for(kube)
    gate = memo.gate

    async def body() -> None:
        await until(lambda: kube.reads == 1, 5, "the task's first look")
        loop = asyncio.get_running_loop()
        kube.fail_reads = True
        assert await loop.run_in_executor(None, lambda: gate.active(fresh=True)) is False
        gate.refused("b", "two")
        kube.fail_reads = False
        assert await loop.run_in_executor(None, lambda: gate.active(fresh=True)) is True
        await until(lambda: memo.queued, 5, "the refused key queued again")

    with_handover(memo, body)
    assert memo.queued == [("b", "two")] and handovers(memo) == 0


def test_an_active_replica_never_hands_over():
    kube = FakeKube({}, [("a", "one")])
    memo = memo_for(kube, lifetime=1)   # looks every 0.5 s

    async def body() -> None:
        await until(lambda: kube.reads >= 4, 5, "four looks")

    with_handover(memo, body)
    assert handovers(memo) == 0 and memo.queued == []
