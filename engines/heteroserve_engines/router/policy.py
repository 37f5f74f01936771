"""Routing policies: pure functions from (request, snapshot of the upstreams, offload state) to a
decision and its reason. No I/O, no clock: the caller passes `now`.

The cost model behind `auto` (sysHAX's `--enable-auto-pd-offload`, "PD offloading when swap-out is
triggered", generalised to any accelerator engine that exports vLLM's metrics):

- The accelerator is the fast tier. While it has room, it serves whole requests: a CPU engine
  decodes a sequence several times slower, so moving work to it only pays when the accelerator
  would otherwise make requests wait.
- The accelerator is *under pressure* when its best upstream (the least loaded healthy one) has
  KV-cache usage above `kvCacheUsageThreshold` (the next admissions would evict or swap: the
  sysHAX swap-out moment), has `waitingThreshold` or more requests queued, has preempted since
  the last scrape, or holds `maxConcurrency` requests from this router.
- Under pressure, new requests go to the CPU tier while a CPU engine has batch room
  (`cpuMaxBatchSize` requests from this router) and decodes at least `minCpuTokensPerSecond` per
  sequence (measured from its generated-token counter; an idle engine counts as fast). A CPU
  engine on the router's node is preferred (no network hop; the sysHAX placement).
- Hysteresis: offloading, once on, stays on for at least `holdSeconds` and until the accelerator's
  KV usage is `hysteresis` below the threshold with nothing waiting and no new preemption.
- With the KV hand-off (the accelerator tier exports KV, the CPU tier imports it), an offloaded
  request is split: the accelerator computes the prompt and the CPU engine pulls its KV and
  decodes; without it (or with the accelerator at its limit) the CPU tier recomputes the prompt.
- When the CPU tier is full or slow, the accelerator still takes the request (its own queue is
  the right place to wait) unless it is at `maxConcurrency`; when every tier is full, 429.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from ..protocol.router_config import Offload, Policy, TierName


@dataclass(frozen=True)
class UpstreamState:
    """One upstream as the policy sees it: health, the router's own in-flight count, and what its
    last metrics scrape said (None: not known)."""

    url: str
    tier: TierName
    healthy: bool = True
    in_flight: int = 0
    max_concurrency: int = 256
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preempted: bool = False  # its preemption counter grew at the last scrape
    tokens_per_second: float | None = None  # measured decode speed per sequence
    same_node: bool = False

    @property
    def load(self) -> tuple[float, float, float]:
        """Ordering key: fewer in flight, fewer queued, emptier KV cache first."""
        return (self.in_flight, self.waiting or 0.0, self.kv_usage or 0.0)


@dataclass(frozen=True)
class Snapshot:
    upstreams: tuple[UpstreamState, ...] = ()

    def tier(self, name: TierName) -> list[UpstreamState]:
        return [u for u in self.upstreams if u.tier == name]

    def healthy(self, name: TierName) -> list[UpstreamState]:
        return sorted((u for u in self.upstreams if u.tier == name and u.healthy),
                      key=lambda u: u.load)


@dataclass(frozen=True)
class RequestInfo:
    kind: Literal["chat", "completion"] = "chat"
    stream: bool = False
    max_tokens: int | None = None


@dataclass(frozen=True)
class OffloadState:
    """What `auto` remembers between decisions (its hysteresis)."""

    offloading: bool = False
    since: float = 0.0
    cause: str = ""


@dataclass(frozen=True)
class Decision:
    """`tier` None: the request is refused with `status` (429 all full, 503 none healthy, 501
    unsupported). `candidates`: upstreams to try in order (the first, then retries)."""

    tier: TierName | None
    reason: str
    candidates: tuple[UpstreamState, ...] = ()
    mode: Literal["whole", "split"] = "whole"
    status: int = 200
    message: str = ""
    offload: bool = False  # an auto decision that moved the request off the accelerator
    fallbacks: tuple[UpstreamState, ...] = field(default=())  # other tier, for retries
    prefill: tuple[UpstreamState, ...] = field(default=())  # split: who prefills, in order


def _refuse(status: int, reason: str, message: str) -> Decision:
    return Decision(None, reason, status=status, message=message)


def _with_room(upstreams: list[UpstreamState], limit: int | None = None) -> list[UpstreamState]:
    return [u for u in upstreams if u.in_flight < min(u.max_concurrency, limit or 2**31)]


def _one_tier(snapshot: Snapshot, tier: TierName, reason: str,
              limit: int | None = None) -> Decision:
    healthy = snapshot.healthy(tier)
    if not healthy:
        return _refuse(503, f"{tier}_unavailable",
                       f"no healthy {tier} engine is available; retry later")
    room = _with_room(healthy, limit)
    if not room:
        return _refuse(429, f"{tier}_full", f"every {tier} engine is at its concurrency "
                       "limit; retry later")
    return Decision(tier, reason, tuple(room))


def accelerator_pressure(best: UpstreamState, offload: Offload) -> str:
    """Why the accelerator's best upstream is under pressure, or '' when it is not."""
    if best.in_flight >= best.max_concurrency:
        return "accelerator_full"
    if best.preempted:
        return "accelerator_preempting"
    if best.kv_usage is not None and best.kv_usage > offload.kv_cache_usage_threshold:
        return "accelerator_kv_pressure"
    if best.waiting is not None and best.waiting >= offload.waiting_threshold:
        return "accelerator_queue"
    return ""


def _relieved(best: UpstreamState, offload: Offload) -> bool:
    low = offload.kv_cache_usage_threshold - offload.hysteresis
    return (not best.preempted and best.in_flight < best.max_concurrency
            and (best.kv_usage is None or best.kv_usage <= low)
            and not best.waiting)


def cpu_candidates(snapshot: Snapshot, offload: Offload) -> tuple[list[UpstreamState], str]:
    """CPU upstreams that may take an offloaded request (same node first), or why none may."""
    healthy = snapshot.healthy("cpu")
    if not healthy:
        return [], "cpu_unavailable"
    room = _with_room(healthy, offload.cpu_max_batch_size)
    if not room:
        return [], "cpu_full"
    fast = [u for u in room if u.tokens_per_second is None
            or u.tokens_per_second >= offload.min_cpu_tokens_per_second]
    if not fast:
        return [], "cpu_slow"
    return sorted(fast, key=lambda u: (not u.same_node, u.load)), ""


def decide_auto(snapshot: Snapshot, offload: Offload, state: OffloadState, now: float,
                kv_handoff: bool = False) -> tuple[Decision, OffloadState]:
    accel = snapshot.healthy("accelerator")
    if not snapshot.tier("accelerator"):  # a CPU-only deployment
        return _one_tier(snapshot, "cpu", "cpu_only"), state
    if not accel:
        cpu, why = cpu_candidates(snapshot, offload)
        if cpu:
            return Decision("cpu", "accelerator_unavailable", tuple(cpu)), state
        return _refuse(503, "accelerator_unavailable",
                       "no healthy accelerator engine, and the CPU tier cannot take the "
                       f"request ({why}); retry later"), state
    best = accel[0]
    cause = accelerator_pressure(best, offload)
    if state.offloading:
        if not cause and _relieved(best, offload) and now - state.since >= offload.hold_seconds:
            state = OffloadState(False, now, "")
        elif cause:
            state = replace(state, cause=cause)
    elif cause:
        state = OffloadState(True, now, cause)
    accel_room = _with_room(accel)
    if state.offloading:
        cpu, why = cpu_candidates(snapshot, offload)
        if cpu:
            # With the hand-off, the accelerator still prefills (fast TTFT, its KV freed at
            # once) unless it is at its concurrency limit; else the CPU computes the prompt.
            split = kv_handoff and bool(accel_room)
            return Decision("cpu", state.cause or "offload_hold", tuple(cpu), offload=True,
                            fallbacks=tuple(accel_room), mode="split" if split else "whole",
                            prefill=tuple(accel_room) if split else ()), state
        if accel_room:
            return Decision("accelerator", why, tuple(accel_room)), state
        return _refuse(429, "all_full", "the accelerator and CPU tiers are at capacity; "
                       "retry later"), state
    return Decision("accelerator", "accelerator_has_room", tuple(accel_room),
                    fallbacks=tuple(cpu_candidates(snapshot, offload)[0])), state


def decide(policy: Policy, request: RequestInfo, snapshot: Snapshot, offload: Offload,
           state: OffloadState, now: float, *, kv_handoff: bool = False
           ) -> tuple[Decision, OffloadState]:
    """The decision for one request, and the offload state to remember for the next."""
    del request  # every policy so far decides on load alone; kept for length-aware policies
    if policy == "accelerator":
        return _one_tier(snapshot, "accelerator", "policy_accelerator"), state
    if policy == "cpu":
        return _one_tier(snapshot, "cpu", "policy_cpu"), state
    if policy == "split":
        if not kv_handoff:
            return _refuse(501, "split_unavailable",
                           "policy split (prefill on the accelerator, decode on the CPU) needs "
                           "the KV hand-off, which this deployment's engines do not provide; "
                           "use policy auto, accelerator or cpu"), state
        decision = _one_tier(snapshot, "cpu", "policy_split",
                             limit=offload.cpu_max_batch_size)
        if decision.tier is None:
            return decision, state
        prefill = _one_tier(snapshot, "accelerator", "policy_split")
        if prefill.tier is None:
            return prefill, state
        return replace(decision, mode="split", prefill=prefill.candidates), state
    return decide_auto(snapshot, offload, state, now, kv_handoff)
