"""The CPU engine under overload and abandonment (issue 14), side by side in one run (a script
that prints a table, not a timed test).

    .venv/bin/python -m tests.bench.engine_overload [--max-running 8] [--max-waiting 8]
        [--tokens 32] [--seconds 20] [--rounds 3] [--abandoned 200] [--quick]

One `heteroserve-cpu-engine` serving the embedded SmolLM2-135M on loopback, with small
admission limits (--max-running R sequences decode, --max-waiting W more wait; beyond that a
request is answered 429 `queue_full` with Retry-After). With two or more CPUs the engine runs on
all but the last and the load generator (one asyncio loop, one httpx client) on the last. With
several --client-cpus the load levels (2.) come from one process per client CPU, each with its
own loop and client: one loop answering a storm of refusals saturates its core (the table's
"load generator CPU", the busiest process's CPU time over the level's time; near 100 % the
row measures the client, not the engine).

1. Saturation: long streams are opened one at a time, each held until the engine's own gauges
   (`vllm:num_requests_running` + `vllm:num_requests_waiting`) count it, until one is refused
   429; the streams held then are the saturating load S (R + W when the engine admits as it
   says). While they are held, PROBES requests are sent one at a time: the cost of a refusal
   with nothing queued in front of it (on the client's loop, nothing else running). They are
   dropped and the engine must return to idle.
2. Per round, normal load then overload: S streams, then 2S streams twice, each stream sending
   streaming chat completions (temperature 0, ignore_eos, --tokens tokens) back to back for
   --seconds. After a 429 a stream waits as its Retry-After says (what the openai client does),
   or, in the second overload row, retries at once (a client that ignores it: the worst case for
   the engine, whose event loop answers every refusal, and for the load generator, whose one
   loop then queues the refusals behind each other). Per level: TTFT p50/p99 of the admitted
   requests (to the first chunk with text), the refused requests' latency p50/p99 (to the end
   of the 429, as the client sees it) and the share of them that carry Retry-After.
3. Per round, abandonment: --abandoned long requests (max_tokens up to the context), at most S at
   a time, each dropped by its client after its first --first-tokens chunks with text. From the
   engine's own counters: `vllm:generation_tokens_total` must stop growing and
   `vllm:num_requests_running` return to 0; then a fresh request must complete within 5 s.

Goals (issue 14), for each overload row: at 2S, refused requests get fast 429s (p99 <=
FAST_429_S) all with Retry-After, and admitted requests' TTFT p99 within 1.5x of the TTFT p99
at S (a row whose load generator ran above CLIENT_BOUND of its core measures the client:
its 429 latency is printed, not judged); abandoned requests stop decoding (no token generated
1 s after the engine is idle; idle within IDLE_WITHIN_S of the last disconnect) and a fresh
request completes within 5 s. The table shows medians over rounds; a goal passes when its median
does.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from heteroserve_engines.protocol.binding import parse_cpu_list
from tests.bench.router_overhead import (
    CONTENT,
    KV_BLOCK_BYTES,
    PROMPT,
    Processes,
    describe_machine,
)
from tests.bench.router_overhead import nearest as percentile
from tests.processes import metric_value

MODEL = "smollm2"
MAX_MODEL_LEN = 1024
PROMPT_TOKEN_BUDGET = 64  # PROMPT in SmolLM2's chat template, with room to spare
FAST_429_S = 0.1  # a refusal slower than this is no longer "fast" (a tenth of a second)
TTFT_RATIO = 1.5  # admitted TTFT p99 at 2S over the TTFT p99 at S, at most
FRESH_WITHIN_S = 5.0  # a fresh request after the abandonment completes within this
IDLE_WITHIN_S = 5.0  # the engine is idle (nothing running or waiting) this soon after
STOPPED_CHECK_S = 1.0  # generation_tokens_total is read twice this far apart once idle
PROBES = 200  # refusals sent one at a time while the engine is saturated
# A load generator busier than this (CPU time over wall time, its busiest process) is the
# bottleneck: a level's latencies then measure its own queueing, and are not judged.
CLIENT_BOUND = 0.8


# -- the engine's gauges and counters ----------------------------------------------------------
class EngineMetrics:
    def __init__(self, client: httpx.AsyncClient, base: str):
        self.client, self.url = client, f"{base}/metrics"

    async def read(self) -> dict[str, float]:
        text = (await self.client.get(self.url)).text
        return {name: metric_value(text, name) for name in (
            "vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:generation_tokens_total")}

    async def held(self) -> int:
        values = await self.read()
        return int(values["vllm:num_requests_running"] + values["vllm:num_requests_waiting"])

    async def wait_idle(self, timeout: float, since: float | None = None) -> float | None:
        """Seconds from `since` (perf_counter; default now) until nothing runs or waits, or None
        when that does not come within timeout."""
        start = time.perf_counter() if since is None else since
        while time.perf_counter() - start < timeout:
            if await self.held() == 0:
                return time.perf_counter() - start
            await asyncio.sleep(0.02)
        return None


def chat_body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                       "stream": True, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()


HEADERS = {"content-type": "application/json"}


# -- 1. saturation -----------------------------------------------------------------------------
async def hold(client: httpx.AsyncClient, url: str, body: bytes, status: asyncio.Future) -> None:
    """A stream held open (reading) until cancelled; `status` gets its HTTP status."""
    try:
        async with client.stream("POST", url, content=body, headers=HEADERS) as response:
            status.set_result(response.status_code)
            async for _ in response.aiter_raw():
                pass
    except httpx.HTTPError as error:
        if not status.done():
            status.set_exception(error)


async def find_saturation(client: httpx.AsyncClient, base: str, metrics: EngineMetrics,
                          limit: int, long_tokens: int) -> tuple[int, Level]:
    """The number of streams the engine admits before its first 429, and the refusals of
    PROBES requests sent one at a time then."""
    url, body = f"{base}/v1/chat/completions", chat_body(long_tokens)
    holders: list[asyncio.Task] = []
    admitted = 0
    try:
        for n in range(1, limit + 1):
            status = asyncio.get_running_loop().create_future()
            holders.append(asyncio.create_task(hold(client, url, body, status)))
            deadline = time.perf_counter() + 30
            while True:
                if status.done() and status.result() != 200:
                    if status.result() != 429:
                        raise RuntimeError(f"stream {n}: HTTP {status.result()}")
                    probe = Level(0)
                    for _ in range(PROBES):
                        await one_request(client, url, chat_body(2), probe)
                    return admitted, probe
                if await metrics.held() >= n:
                    admitted = n
                    break
                if time.perf_counter() > deadline:
                    raise RuntimeError(f"stream {n} was neither admitted nor refused in 30 s")
                await asyncio.sleep(0.01)
        raise RuntimeError(f"no 429 within {limit} streams")
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
        if await metrics.wait_idle(30) is None:
            raise RuntimeError("the engine did not return to idle after the saturation probe")


# -- 2. normal load and overload ---------------------------------------------------------------
@dataclass
class Level:
    streams: int
    ttfts: list[float] = field(default_factory=list)      # admitted requests
    refused: list[float] = field(default_factory=list)    # 429 latencies
    retry_after: int = 0                                   # 429s with the header
    errors: list[str] = field(default_factory=list)
    last_retry_after: float = 0.0                          # its value, seconds
    client_cpu: float = math.nan  # the load generator's CPU time over the level's wall time

    @property
    def header_rate(self) -> float:
        return self.retry_after / len(self.refused) if self.refused else math.nan


async def one_request(client: httpx.AsyncClient, url: str, body: bytes, level: Level) -> bool:
    """Records one request in `level`; True when it was refused 429."""
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, content=body, headers=HEADERS) as response:
            if response.status_code != 200:
                await response.aread()
                if response.status_code != 429:
                    level.errors.append(f"HTTP {response.status_code}")
                    return False
                level.refused.append(time.perf_counter() - start)
                level.retry_after += "retry-after" in response.headers
                level.last_retry_after = float(response.headers.get("retry-after", 0))
                return True
            first = None
            async for data in response.aiter_raw():
                if first is None and CONTENT.search(data):
                    first = time.perf_counter() - start
            if first is None:
                level.errors.append("no content")
            else:
                level.ttfts.append(first)
    except httpx.HTTPError as error:
        level.errors.append(type(error).__name__)
    return False


async def run_level(client: httpx.AsyncClient, base: str, streams: int, tokens: int,
                    seconds: float, honour_retry_after: bool) -> Level:
    url, body = f"{base}/v1/chat/completions", chat_body(tokens)
    level = Level(streams)
    deadline = time.perf_counter() + seconds

    async def stream() -> None:
        while time.perf_counter() < deadline:
            if await one_request(client, url, body, level) and honour_retry_after:
                await asyncio.sleep(min(level.last_retry_after, deadline - time.perf_counter()))

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(streams)))
    # Near 1.0 the load generator is the bottleneck: latencies then include its own queueing.
    level.client_cpu = (time.process_time() - cpu) / (time.perf_counter() - wall)
    return level


def _worker_level(base: str, streams: int, tokens: int, seconds: float, honour: bool,
                  start_at: float) -> Level:
    """One load-generator process's share of a level: its own loop and client, starting at
    `start_at` (time.time()) so that every process's streams begin together."""
    async def run() -> Level:
        limits = httpx.Limits(max_connections=2 * streams + 4,
                              max_keepalive_connections=2 * streams + 4)
        async with httpx.AsyncClient(limits=limits,
                                     timeout=httpx.Timeout(300, connect=30)) as client:
            await run_level(client, base, streams, 2, 1, False)  # connections, code paths
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return await run_level(client, base, streams, tokens, seconds, honour)
    return asyncio.run(run())


class LoadGenerators:
    """Load levels from one process per client CPU (each its own asyncio loop and httpx
    client), so that a level of many refused streams retrying at once measures the engine,
    not one saturated Python loop of the load generator (seen: 97 % of its core, 429 p99 four
    times the engine's own). With one client CPU, levels run in this process."""

    def __init__(self, cpus: set[int]):
        self.cpus = sorted(cpus)
        self.pool = None
        if len(self.cpus) > 1:
            context = multiprocessing.get_context("spawn")
            self.pool = concurrent.futures.ProcessPoolExecutor(
                len(self.cpus), mp_context=context, initializer=os.sched_setaffinity,
                initargs=(0, set(self.cpus)))

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()

    async def level(self, client: httpx.AsyncClient, base: str, streams: int, tokens: int,
                    seconds: float, honour: bool) -> Level:
        if self.pool is None:
            return await run_level(client, base, streams, tokens, seconds, honour)
        shares = [streams // len(self.cpus) + (i < streams % len(self.cpus))
                  for i in range(len(self.cpus))]
        start_at = time.time() + 3.0  # after every worker has warmed up
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(*(
            loop.run_in_executor(self.pool, _worker_level, base, share, tokens, seconds, honour,
                                 start_at) for share in shares if share))
        merged = Level(streams)
        for part in parts:
            merged.ttfts += part.ttfts
            merged.refused += part.refused
            merged.retry_after += part.retry_after
            merged.errors += part.errors
        merged.client_cpu = max(part.client_cpu for part in parts)  # the busiest process
        return merged


# -- 3. abandonment ----------------------------------------------------------------------------
@dataclass
class Abandonment:
    requests: int
    refusals: int             # 429s on the way (retried)
    tokens_during: float      # generated while the abandoned requests ran
    tokens_after: float       # generated after the last client left
    idle_after: float | None  # seconds from the last disconnect to nothing running or waiting
    stopped: bool             # no token generated over STOPPED_CHECK_S once idle
    running_after: float      # vllm:num_requests_running then
    fresh: float | None       # seconds for a fresh request to complete (None: it failed)
    errors: list[str]


async def abandon(client: httpx.AsyncClient, base: str, metrics: EngineMetrics, count: int,
                  concurrency: int, long_tokens: int, first_tokens: int) -> Abandonment:
    url, body = f"{base}/v1/chat/completions", chat_body(long_tokens)
    slots = asyncio.Semaphore(concurrency)
    refusals, errors = 0, []

    async def one() -> None:
        nonlocal refusals
        while True:
            async with slots:
                try:
                    async with client.stream("POST", url, content=body,
                                             headers=HEADERS) as response:
                        if response.status_code == 200:
                            seen = 0
                            async for data in response.aiter_raw():
                                seen += len(CONTENT.findall(data))
                                if seen >= first_tokens:
                                    break
                            # Leaving the block unread closes the connection: the client left.
                            return
                        await response.aread()
                        if response.status_code != 429:
                            errors.append(f"HTTP {response.status_code}")
                            return
                        refusals += 1
                except httpx.HTTPError as error:
                    errors.append(type(error).__name__)
                    return
            await asyncio.sleep(0.05)

    before = (await metrics.read())["vllm:generation_tokens_total"]
    await asyncio.gather(*(one() for _ in range(count)))
    last_left = time.perf_counter()
    left = (await metrics.read())["vllm:generation_tokens_total"]
    idle_after = await metrics.wait_idle(IDLE_WITHIN_S * 4, since=last_left)
    idle = await metrics.read()
    await asyncio.sleep(STOPPED_CHECK_S)
    later = await metrics.read()
    start = time.perf_counter()
    fresh = None
    try:
        response = await client.post(url, headers=HEADERS, timeout=30, content=json.dumps({
            "model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 16, "temperature": 0}).encode())
        if response.status_code == 200 and response.json()["choices"][0]["message"]["content"]:
            fresh = time.perf_counter() - start
        else:
            errors.append(f"fresh request: HTTP {response.status_code}")
    except httpx.HTTPError as error:
        errors.append(f"fresh request: {type(error).__name__}")
    return Abandonment(
        count, refusals, left - before, idle["vllm:generation_tokens_total"] - left,
        idle_after,
        later["vllm:generation_tokens_total"] == idle["vllm:generation_tokens_total"],
        later["vllm:num_requests_running"], fresh, errors)


# -- the run -----------------------------------------------------------------------------------
@dataclass
class Round:
    normal: Level
    overload: Level        # refused streams wait as Retry-After says
    overload_eager: Level  # refused streams retry at once
    abandonment: Abandonment | None


async def measure(base: str, args, long_tokens: int, generators: LoadGenerators
                  ) -> tuple[int, Level, list[Round]]:
    connections = 4 * (args.max_running + args.max_waiting) + 8
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(300, connect=30)) as client:
        metrics = EngineMetrics(client, base)
        saturating, probe = await find_saturation(client, base, metrics,
                                           4 * (args.max_running + args.max_waiting) + 4,
                                           long_tokens)
        print(f"  saturating load: {saturating} streams", file=sys.stderr, flush=True)
        # Warm-up: first-request code paths and connections for the widest level.
        await run_level(client, base, 2 * saturating, 2, 2, False)
        await metrics.wait_idle(30)
        rounds = []
        for index in range(args.rounds):
            levels = []
            for streams, honour in ((saturating, True), (2 * saturating, True),
                                    (2 * saturating, False)):
                levels.append(await generators.level(client, base, streams, args.tokens,
                                                     args.seconds, honour))
                await metrics.wait_idle(30)
            abandonment = None
            if args.abandoned:
                abandonment = await abandon(client, base, metrics, args.abandoned, saturating,
                                            long_tokens, args.first_tokens)
            rounds.append(Round(*levels, abandonment))
            print(f"  round {index + 1}: done", file=sys.stderr, flush=True)
    return saturating, probe, rounds


def med(values) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def report(saturating: int, probe: Level, rounds: list[Round], args, machine: str) -> bool:
    sys.stderr.flush()
    print(f"\n{machine}")
    print(f"engine: --max-running {args.max_running} --max-waiting {args.max_waiting}, "
          f"--max-model-len {MAX_MODEL_LEN}; saturating load found: {saturating} streams "
          f"(R + W = {args.max_running + args.max_waiting}); {args.tokens} tokens per request, "
          f"{args.seconds:g} s per level; medians of {len(rounds)} round(s)\n")
    print(f"refused one at a time while saturated ({len(probe.refused)} requests): 429 p50 "
          f"{1e3 * percentile(probe.refused, .5):.1f} ms, p99 "
          f"{1e3 * percentile(probe.refused, .99):.1f} ms, Retry-After on "
          f"{100 * probe.header_rate:.0f} %\n")
    print("| load | streams | admitted | TTFT p50 ms | TTFT p99 ms | refused (429) | 429 p50 ms "
          "| 429 p99 ms | Retry-After | load generator CPU | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = (("normal (S)", lambda r: r.normal),
            ("overload (2S), Retry-After honoured", lambda r: r.overload),
            ("overload (2S), retried at once", lambda r: r.overload_eager))
    for name, pick in rows:
        levels = [pick(r) for r in rounds]
        errors = [e for lv in levels for e in lv.errors]
        shown = f"{len(errors)} ({', '.join(sorted(set(errors))[:3])})" if errors else "0"
        rate = med(lv.header_rate for lv in levels)
        print(f"| {name} | {levels[0].streams} | {med(len(lv.ttfts) for lv in levels):.0f} | "
              f"{1e3 * med(percentile(lv.ttfts, .5) for lv in levels):.0f} | "
              f"{1e3 * med(percentile(lv.ttfts, .99) for lv in levels):.0f} | "
              f"{med(len(lv.refused) for lv in levels):.0f} | "
              f"{1e3 * med(percentile(lv.refused, .5) for lv in levels):.1f} | "
              f"{1e3 * med(percentile(lv.refused, .99) for lv in levels):.1f} | "
              f"{'' if math.isnan(rate) else f'{100 * rate:.0f} %'} | "
              f"{100 * med(lv.client_cpu for lv in levels):.0f} % | {shown} |")
    goals = []
    for name, pick in rows[1:]:
        ratio = med(percentile(pick(r).ttfts, .99) / percentile(r.normal.ttfts, .99)
                    for r in rounds)
        refused_p99 = med(percentile(pick(r).refused, .99) for r in rounds)
        header_rate = min((pick(r).header_rate for r in rounds), default=math.nan)
        client = med(pick(r).client_cpu for r in rounds)
        fast = f"429 p99 {1e3 * refused_p99:.1f} ms (<= {1e3 * FAST_429_S:.0f} ms)"
        if client > CLIENT_BOUND:
            # The latency is the load generator's own queueing: no verdict on the engine.
            fast += (f"; not judged: the load generator ran at {100 * client:.0f} % of its core "
                     "(the row measures the client: give it more --client-cpus)")
        goals += [
            (f"{name}: refused requests get fast 429s", fast,
             None if client > CLIENT_BOUND else refused_p99 <= FAST_429_S),
            (f"{name}: every 429 has Retry-After",
             f"lowest rate over rounds {100 * header_rate:.1f} %", header_rate == 1.0),
            (f"{name}: admitted TTFT p99 within 1.5x of S's",
             f"ratio {ratio:.2f} (<= {TTFT_RATIO})", ratio <= TTFT_RATIO),
        ]
    done = [r.abandonment for r in rounds if r.abandonment]
    if done:
        print(f"\nabandonment: {done[0].requests} long requests (max_tokens "
              f"{MAX_MODEL_LEN - PROMPT_TOKEN_BUDGET}), at most {saturating} at a time, each "
              f"dropped after {args.first_tokens} chunks with text\n")
        print("| round | 429s retried | tokens generated while they ran | tokens after the last "
              "left | idle after s | tokens in the next 1 s | running then | fresh request s | "
              "errors |")
        print("|---|---|---|---|---|---|---|---|---|")
        for index, a in enumerate(done, 1):
            idle = "never" if a.idle_after is None else f"{a.idle_after:.2f}"
            fresh = "failed" if a.fresh is None else f"{a.fresh:.2f}"
            print(f"| {index} | {a.refusals} | {a.tokens_during:.0f} | {a.tokens_after:.0f} | "
                  f"{idle} | {'0' if a.stopped else 'grew'} | {a.running_after:.0f} | {fresh} | "
                  f"{len(a.errors)} {'; '.join(sorted(set(a.errors))[:2])} |")
        idle = med(a.idle_after if a.idle_after is not None else math.inf for a in done)
        fresh = med(a.fresh if a.fresh is not None else math.inf for a in done)
        goals += [
            ("abandoned requests stop decoding",
             f"idle {idle:.2f} s after the last disconnect (<= {IDLE_WITHIN_S:g} s); tokens "
             f"stopped in {sum(a.stopped for a in done)}/{len(done)} rounds; running 0 in "
             f"{sum(a.running_after == 0 for a in done)}/{len(done)}",
             idle <= IDLE_WITHIN_S and all(a.stopped and a.running_after == 0 for a in done)),
            ("a fresh request completes within 5 s", f"{fresh:.2f} s", fresh <= FRESH_WITHIN_S),
        ]
    print("\ngoals:")
    for goal, figure, met in goals:
        print(f"  {'----' if met is None else 'PASS' if met else 'FAIL'}  {goal}: {figure}")
    return all(met is True for _, _, met in goals)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-running", type=int, default=8, help="the engine's --max-running")
    parser.add_argument("--max-waiting", type=int, default=8, help="the engine's --max-waiting")
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of the load requests")
    parser.add_argument("--seconds", type=float, default=20, help="duration of each load level")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--abandoned", type=int, default=200,
                        help="long requests abandoned per round (0: skip)")
    parser.add_argument("--first-tokens", type=int, default=2,
                        help="chunks with text an abandoning client reads before it leaves")
    parser.add_argument("--engine-cpus", default=None,
                        help="CPUs of the engine (default: all but the last when there are two "
                        "or more)")
    parser.add_argument("--client-cpus", default=None,
                        help="CPUs of the load generator, one process each for the load "
                        "levels (default: the last)")
    parser.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one round of 5 s levels, 40 abandoned requests")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds, args.abandoned = 1, 5, 40
    allowed = sorted(os.sched_getaffinity(0))
    client_cpus = (set(parse_cpu_list(args.client_cpus)) if args.client_cpus
                   else {allowed[-1]} if len(allowed) > 1 else set(allowed))
    engine_cpus = (set(parse_cpu_list(args.engine_cpus)) if args.engine_cpus
                   else set(allowed) - client_cpus or set(allowed))
    long_tokens = MAX_MODEL_LEN - PROMPT_TOKEN_BUDGET
    blocks = -(-MAX_MODEL_LEN // 16)
    kv_gib = max(0.25, 1.25 * args.max_running * blocks * KV_BLOCK_BYTES / 2**30)
    machine = describe_machine() + (f"; engine on CPUs {sorted(engine_cpus)} "
                                    f"({len(engine_cpus)} threads), load generator on "
                                    f"{sorted(client_cpus)}")
    with tempfile.TemporaryDirectory(prefix="engine-overload-") as folder:
        procs = Processes(Path(folder))
        try:
            port = procs.start("engine", [
                "heteroserve_engines.cpu_engine", "--served-model-name", MODEL,
                "--max-model-len", str(MAX_MODEL_LEN), "--max-running", str(args.max_running),
                "--max-waiting", str(args.max_waiting), "--kv-cache-gib", f"{kv_gib:.2f}",
                *(["--model", args.model] if args.model else [])],
                cpus=engine_cpus, env={
                    "OMP_NUM_THREADS": str(len(engine_cpus)),
                    "CUSTOM_CPU_AFFINITY": ",".join(map(str, sorted(engine_cpus)))})
            base = f"http://127.0.0.1:{port}"
            procs.wait("engine", f"{base}/health")
            os.sched_setaffinity(0, client_cpus)
            generators = LoadGenerators(client_cpus)
            try:
                saturating, probe, rounds = asyncio.run(measure(base, args, long_tokens,
                                                                generators))
            finally:
                generators.close()
        finally:
            procs.stop()
    return 0 if report(saturating, probe, rounds, args, machine) else 1


if __name__ == "__main__":
    sys.exit(main())
