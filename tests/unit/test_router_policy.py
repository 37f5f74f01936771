"""The router's routing policies (`router.policy.decide`): pure decisions over a snapshot of the
upstreams, tested without sockets or a clock."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from heteroserve_engines.protocol.router_config import Offload
from heteroserve_engines.router.policy import (
    Decision,
    OffloadState,
    RequestInfo,
    Snapshot,
    UpstreamState,
    decide,
)

OFFLOAD = Offload()  # threshold 0.9, waiting 1, hysteresis 0.1, hold 2 s, 10 tok/s, batch 16
REQUEST = RequestInfo()
IDLE = OffloadState()
OFFLOADING = OffloadState(True, 0.0, "accelerator_kv_pressure")


def acc(name: str = "a1", **load) -> UpstreamState:
    return UpstreamState(url=f"http://{name}:8000", tier="accelerator", **load)


def cpu(name: str = "c1", **load) -> UpstreamState:
    return UpstreamState(url=f"http://{name}:8000", tier="cpu", **load)


def urls(upstreams: tuple[UpstreamState, ...]) -> list[str]:
    return [u.url.removeprefix("http://").removesuffix(":8000") for u in upstreams]


def run(policy: str, *upstreams: UpstreamState, state: OffloadState = IDLE,
        now: float = 100.0, kv_handoff: bool = False) -> tuple[Decision, OffloadState]:
    return decide(policy, REQUEST, Snapshot(upstreams), OFFLOAD, state, now,
                  kv_handoff=kv_handoff)


@dataclass(frozen=True)
class Case:
    policy: str
    upstreams: tuple[UpstreamState, ...]
    tier: str | None
    reason: str
    candidates: tuple[str, ...] = ()
    status: int = 200
    offload: bool = False
    state: OffloadState = IDLE


# -- single-tier policies -------------------------------------------------------------------------

SINGLE_TIER = [
    pytest.param(Case("accelerator", (acc("a1", in_flight=3), acc("a2", in_flight=1)),
                      "accelerator", "policy_accelerator", ("a2", "a1")),
                 id="accelerator-least-loaded-first"),
    pytest.param(Case("accelerator", (acc("a1", in_flight=1, waiting=4), acc("a2", in_flight=1)),
                      "accelerator", "policy_accelerator", ("a2", "a1")),
                 id="accelerator-ties-broken-by-waiting"),
    pytest.param(Case("accelerator", (acc("a1", healthy=False), acc("a2", in_flight=9)),
                      "accelerator", "policy_accelerator", ("a2",)),
                 id="accelerator-skips-unhealthy"),
    pytest.param(Case("accelerator", (acc("a1", healthy=False), cpu("c1")), None,
                      "accelerator_unavailable", status=503),
                 id="accelerator-none-healthy-503"),
    pytest.param(Case("accelerator", (acc("a1", in_flight=4, max_concurrency=4),
                                      acc("a2", in_flight=2, max_concurrency=2)),
                      None, "accelerator_full", status=429),
                 id="accelerator-all-at-max-concurrency-429"),
    pytest.param(Case("accelerator", (acc("a1", in_flight=4, max_concurrency=4),
                                      acc("a2", in_flight=5, max_concurrency=8)),
                      "accelerator", "policy_accelerator", ("a2",)),
                 id="accelerator-full-upstream-left-out"),
    pytest.param(Case("cpu", (cpu("c1", in_flight=2), cpu("c2"), acc("a1")),
                      "cpu", "policy_cpu", ("c2", "c1")),
                 id="cpu-least-loaded-first"),
    pytest.param(Case("cpu", (cpu("c1", healthy=False), acc("a1")), None, "cpu_unavailable",
                      status=503),
                 id="cpu-none-healthy-503"),
    pytest.param(Case("cpu", (cpu("c1", in_flight=1, max_concurrency=1),), None, "cpu_full",
                      status=429),
                 id="cpu-all-at-max-concurrency-429"),
    pytest.param(Case("split", (acc("a1"), cpu("c1")), None, "split_unavailable", status=501),
                 id="split-without-kv-handoff-501"),
]


@pytest.mark.parametrize("case", SINGLE_TIER)
def test_single_tier_policies(case: Case) -> None:
    decision, state = run(case.policy, *case.upstreams, state=case.state)
    assert (decision.tier, decision.reason, decision.status) == (case.tier, case.reason,
                                                                 case.status)
    assert urls(decision.candidates) == list(case.candidates)
    assert decision.fallbacks == ()
    assert state == case.state  # only auto has state
    if decision.tier is None:
        assert decision.message


def test_split_with_kv_handoff_decodes_on_the_cpu_within_its_batch_size() -> None:
    decision, _ = run("split", acc("a1"), cpu("c1", in_flight=16), cpu("c2", in_flight=3),
                      kv_handoff=True)
    assert (decision.tier, decision.mode, decision.reason) == ("cpu", "split", "policy_split")
    assert urls(decision.candidates) == ["c2"]


# -- auto -----------------------------------------------------------------------------------------

AUTO = [
    pytest.param(Case("auto", (acc("a1", kv_usage=0.5, waiting=0), cpu("c1")),
                      "accelerator", "accelerator_has_room", ("a1",)),
                 id="accelerator-has-room"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.9), cpu("c1")),
                      "accelerator", "accelerator_has_room", ("a1",)),
                 id="kv-at-threshold-is-not-pressure"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1")),
                      "cpu", "accelerator_kv_pressure", ("c1",), offload=True),
                 id="kv-over-threshold-offloads"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.2, waiting=1), cpu("c1")),
                      "cpu", "accelerator_queue", ("c1",), offload=True),
                 id="waiting-at-threshold-offloads"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.2, preempted=True), cpu("c1")),
                      "cpu", "accelerator_preempting", ("c1",), offload=True),
                 id="preemption-offloads"),
    pytest.param(Case("auto", (acc("a1", in_flight=4, max_concurrency=4), cpu("c1")),
                      "cpu", "accelerator_full", ("c1",), offload=True),
                 id="accelerator-at-max-concurrency-offloads"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), acc("a2", in_flight=1, kv_usage=0.3),
                               cpu("c1")),
                      "cpu", "accelerator_kv_pressure", ("c1",), offload=True),
                 id="pressure-judged-on-least-loaded-accelerator"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", in_flight=16)),
                      "accelerator", "cpu_full", ("a1",)),
                 id="cpu-full-stays-on-accelerator"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", in_flight=2,
                                                              max_concurrency=2)),
                      "accelerator", "cpu_full", ("a1",)),
                 id="cpu-at-its-max-concurrency-is-full"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", tokens_per_second=9.5)),
                      "accelerator", "cpu_slow", ("a1",)),
                 id="cpu-slow-stays-on-accelerator"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", tokens_per_second=10.0)),
                      "cpu", "accelerator_kv_pressure", ("c1",), offload=True),
                 id="cpu-at-min-speed-is-fast-enough"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", tokens_per_second=None)),
                      "cpu", "accelerator_kv_pressure", ("c1",), offload=True),
                 id="idle-cpu-counts-as-fast"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", healthy=False)),
                      "accelerator", "cpu_unavailable", ("a1",)),
                 id="cpu-down-stays-on-accelerator"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1", tokens_per_second=3.0),
                               cpu("c2", in_flight=5, tokens_per_second=20.0)),
                      "cpu", "accelerator_kv_pressure", ("c2",), offload=True),
                 id="slow-cpu-left-out"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.95), cpu("c1"),
                               cpu("c2", in_flight=7, same_node=True)),
                      "cpu", "accelerator_kv_pressure", ("c2", "c1"), offload=True),
                 id="same-node-cpu-preferred-over-less-loaded"),
    pytest.param(Case("auto", (acc("a1", healthy=False), cpu("c1", in_flight=3), cpu("c2")),
                      "cpu", "accelerator_unavailable", ("c2", "c1")),
                 id="accelerator-down-goes-to-cpu"),
    pytest.param(Case("auto", (acc("a1", healthy=False), cpu("c1", in_flight=16)),
                      None, "accelerator_unavailable", status=503),
                 id="accelerator-down-cpu-full-503"),
    pytest.param(Case("auto", (acc("a1", in_flight=4, max_concurrency=4),
                               cpu("c1", in_flight=16)),
                      None, "all_full", status=429),
                 id="everything-full-429"),
    pytest.param(Case("auto", (cpu("c1", in_flight=2), cpu("c2")),
                      "cpu", "cpu_only", ("c2", "c1")),
                 id="cpu-only-deployment"),
    pytest.param(Case("auto", (cpu("c1", healthy=False),), None, "cpu_unavailable",
                      status=503),
                 id="cpu-only-deployment-none-healthy-503"),
    pytest.param(Case("auto", (acc("a1", kv_usage=0.85), cpu("c1")),
                      "cpu", "accelerator_kv_pressure", ("c1",), offload=True,
                      state=OFFLOADING),
                 id="offloading-stays-on-inside-hysteresis-band"),
]


@pytest.mark.parametrize("case", AUTO)
def test_auto(case: Case) -> None:
    decision, _ = run("auto", *case.upstreams, state=case.state)
    assert (decision.tier, decision.reason, decision.status, decision.offload) == (
        case.tier, case.reason, case.status, case.offload)
    assert urls(decision.candidates) == list(case.candidates)
    assert decision.mode == "whole"


def test_auto_accelerator_decision_carries_cpu_fallbacks() -> None:
    decision, _ = run("auto", acc("a1"), cpu("c1", in_flight=2), cpu("c2", same_node=True),
                      cpu("c3", tokens_per_second=1.0), cpu("c4", in_flight=16))
    assert decision.reason == "accelerator_has_room"
    assert urls(decision.fallbacks) == ["c2", "c1"]  # same node first; slow and full left out


def test_auto_offload_decision_carries_accelerator_fallbacks() -> None:
    decision, _ = run("auto", acc("a1", kv_usage=0.95), acc("a2", in_flight=1, kv_usage=0.97),
                      acc("a3", in_flight=1, max_concurrency=1), cpu("c1"))
    assert decision.offload
    assert urls(decision.candidates) == ["c1"]
    assert urls(decision.fallbacks) == ["a1", "a2"]  # the full one left out


def test_auto_without_cpu_tier_has_no_fallbacks() -> None:
    decision, _ = run("auto", acc("a1"))
    assert decision.reason == "accelerator_has_room"
    assert decision.fallbacks == ()


# -- hysteresis -----------------------------------------------------------------------------------


def replay(steps: list[tuple[float, dict]], offload: Offload = OFFLOAD
           ) -> list[tuple[Decision, OffloadState]]:
    """decide() over a timeline of (now, accelerator load), carrying the offload state."""
    state, out = OffloadState(), []
    for now, load in steps:
        decision, state = decide("auto", REQUEST, Snapshot((acc("a1", **load), cpu("c1"))),
                                 offload, state, now)
        out.append((decision, state))
    return out


def transitions(results: list[tuple[Decision, OffloadState]]) -> int:
    flags = [False] + [state.offloading for _, state in results]
    return sum(a != b for a, b in itertools.pairwise(flags))


def test_hysteresis_holds_then_releases() -> None:
    results = replay([
        (10.0, {"kv_usage": 0.95}),               # over the threshold: offloading starts
        (11.0, {"kv_usage": 0.30, "waiting": 0}),  # relieved, but inside holdSeconds (2 s)
        (13.0, {"kv_usage": 0.85, "waiting": 0}),  # below the threshold, above 0.9 - 0.1
        (14.0, {"kv_usage": 0.70, "waiting": 1}),  # KV low, but a request waits
        (15.0, {"kv_usage": 0.70, "waiting": 0}),  # relieved, hold over: offloading stops
        (15.5, {"kv_usage": 0.85, "waiting": 0}),  # back in the band: stays off
    ])
    assert [(d.tier, d.reason, d.offload, s.offloading) for d, s in results] == [
        ("cpu", "accelerator_kv_pressure", True, True),
        ("cpu", "accelerator_kv_pressure", True, True),
        ("cpu", "accelerator_kv_pressure", True, True),
        ("cpu", "accelerator_queue", True, True),
        ("accelerator", "accelerator_has_room", False, False),
        ("accelerator", "accelerator_has_room", False, False),
    ]
    assert [s.since for _, s in results][:4] == [10.0] * 4  # the hold counts from the start
    assert transitions(results) == 2


def test_hysteresis_release_at_exactly_threshold_minus_hysteresis() -> None:
    results = replay([(0.0, {"kv_usage": 0.95}), (2.0, {"kv_usage": 0.8})])
    assert [s.offloading for _, s in results] == [True, False]


def test_hold_seconds_alone_keeps_offloading_on() -> None:
    results = replay([(0.0, {"kv_usage": 0.95}), (1.99, {"kv_usage": 0.0}),
                      (2.0, {"kv_usage": 0.0})])
    assert [s.offloading for _, s in results] == [True, True, False]


def test_kv_oscillating_around_threshold_does_not_flap() -> None:
    steps = [(0.5 * i, {"kv_usage": 0.91 if i % 2 == 0 else 0.89}) for i in range(40)]
    results = replay(steps)
    assert transitions(results) == 1
    assert all(d.tier == "cpu" for d, _ in results)


def test_without_hysteresis_or_hold_the_same_load_flaps() -> None:
    """The control for the test above: the band and the hold are what stop the flapping."""
    steps = [(0.5 * i, {"kv_usage": 0.91 if i % 2 == 0 else 0.89}) for i in range(40)]
    results = replay(steps, Offload(hysteresis=0, hold_seconds=0))
    assert transitions(results) == 40
