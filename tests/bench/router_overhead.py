"""The router's overhead: router vs direct-to-upstream, side by side in one run (a script, not a
timed test).

    .venv/bin/python -m tests.bench.router_overhead [--concurrency 1,8,64,256] [--tokens N]
        [--canned-tokens N] [--requests N] [--rounds R] [--quick]

Three upstreams, each once directly and once through its own `heteroserve-router` (policy cpu):
the CPU engine serving the embedded SmolLM2-135M (what users run); the canned upstream of
tests/fakes, which streams tokens as fast as it can (the router's own ceiling: there the router,
not the engine, is the bottleneck); and the same canned upstream paced like an accelerator
engine (`--paced-token-delay`, 20 ms a token: 50 tokens/s per stream, 12,800/s for the router to
relay at 256 streams) on one process per upstream CPU, so that it never queues: the engine and
the unpaced canned upstream are saturated at 64 and 256 streams, where their TTFT is seconds of
queueing that moves by more than the router's cost, while the paced upstream answers every
request's first token at once at every level, and what the router adds is what is left.
At each concurrency level N streams send streaming chat
completions (ignore_eos, fixed max_tokens, temperature 0) back to back until at least
`--requests` requests are done (so that one stream still gives a distribution). Per level: TTFT
p50 and p99 (nearest rank), and throughput (tokens of all streams / the level's wall time;
tokens from the engine's usage chunk, the canned upstream's content chunks). Each round runs
direct, then router (A B A B ...: the throughput ratio, router / direct, and the "separate runs"
added TTFT), then both interleaved: every stream alternates direct and router requests, so both
paths meet the same upstream in the same state at the same time. The interleaved difference of
the TTFT percentiles is the added TTFT that the goal is judged on: at 64 and 256 streams the
engine's TTFT is seconds of queueing that moves by more than 2 ms between separate runs. The
table shows medians over rounds. The router's own time comes from its log (`overhead=`: from a
request's arrival to its upstream request, plus relaying the first upstream bytes).

Goals (the router's issue): added TTFT p50 at most 2 ms at every level, and at least 90 % of
direct throughput at 256 streams. By default every stream of a level starts at once (a burst,
which the router handles one request at a time); `--stagger S` spreads their first requests
over S seconds (about one request's duration: steady arrivals), and `--requests-per-stream K`
keeps every stream busy for K requests (a sustained level, not a ramp). The runs the goal is
judged on (docs/benchmarks.md): `--targets paced --concurrency 8,64,256 --paced-tokens 64
--stagger 1.28 --requests-per-stream 4` and `--targets engine --concurrency 1,8 --tokens 16
--stagger 0.35`.

The load generator runs from one process per `--client-cpus` CPU (one asyncio loop and client
each, the streams shared out; with one CPU, in this process), over the router's own plain-HTTP
transport, and never decodes the JSON of a chunk; each row shows its busiest process's CPU
(near 100 %, the row measures the client). With four or more CPUs it has a core of its own; with
fewer it shares the router's (engine rows) or the upstreams' (canned rows). The router rows also
show the router process's CPU time per request (user + system, /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime
import json
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from heteroserve_engines.protocol.binding import parse_cpu_list
from heteroserve_engines.protocol.router_config import Offload, RouterConfig, TierConfig
from heteroserve_engines.router.transport import UpstreamTransport
from tests.processes import free_port, stop_process

ENGINE_MODEL = "smollm2"
PROMPT = "Count from one to one hundred, in words, one number per line."
PROMPT_TOKEN_BUDGET = 64  # the prompt above in SmolLM2's chat template, with room to spare
MAX_MODEL_LEN = 512
# SmolLM2-135M's KV cache per 16-token block: K and V, fp16, 30 layers, 3 KV heads of 64.
KV_BLOCK_BYTES = 2 * 2 * 30 * 16 * 3 * 64
# A chunk that carries text: `"content":"` (the engine's compact JSON) or `"content": "`
# (the canned upstream's) followed by anything but the closing quote. The engine's first chunk
# is role-only (`"content":""`) and its last may have no content: neither counts. So TTFT is
# the time to the first chunk with text, not to the first `data:` line.
CONTENT = re.compile(rb'"content": ?"[^"]')
# The engine's last chunk (stream_options.include_usage): tokens generated, which is more than
# the content chunks when a token has no text of its own (with ignore_eos, SmolLM2 goes on past
# <|im_end|>, whose text is empty). The canned upstream sends no usage: its chunks are its tokens.
USAGE = re.compile(rb'"completion_tokens": ?(\d+)')
# An SSE error event (the router's after a broken upstream). Generated text cannot contain
# it unescaped.
ERROR = b'"error":'


# -- processes ---------------------------------------------------------------------------------
@dataclass
class Processes:
    folder: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)

    def start(self, name: str, args: list[str], cpus: set[int] | None = None,
              env: dict[str, str] | None = None) -> int:
        """Starts `python -m args...` with a free port appended, on `cpus`; returns the port."""
        port = free_port()
        with open(self.folder / f"{name}.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", *args, "--port", str(port)],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, **(env or {})})
        if cpus:
            # Before it has started its threads (they inherit it).
            os.sched_setaffinity(proc.pid, cpus)
        self.procs.append(proc)
        self.pids[name] = proc.pid
        return port

    def wait(self, name: str, url: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        log = (self.folder / f"{name}.log").read_text()[-3000:]
        raise RuntimeError(f"{name} did not answer 200 at {url}:\n{log}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


def router_config_file(folder: Path, name: str, model: str, upstream: str, streams: int) -> Path:
    """policy cpu with admission at or above the highest concurrency level: the CLI's defaults
    (maxConcurrency 256, cpuMaxBatchSize 16) would answer 429 or cap the batch. The router
    logs every request at INFO, as deployed."""
    admit = max(256, streams)
    config = RouterConfig(model=model, policy="cpu", drain_seconds=1,
                          cpu=TierConfig(urls=[upstream], max_concurrency=admit),
                          offload=Offload(cpu_max_batch_size=admit))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config.document()))
    return path


def start_all(procs: Processes, streams: int, engine_tokens: int, engine_cpus: set[int],
              router_cpus: set[int], gguf: str | None = None,
              names: tuple[str, ...] = ("engine", "canned", "paced"),
              paced_token_delay: float = 0.02) -> dict[str, tuple[str, str, int]]:
    """{target: (direct base URL, router base URL, router pid)}; every process answers before
    it returns.
    The upstreams run on `engine_cpus`, the routers on `router_cpus` (as in a pod, where the
    router sidecar has a core of its own)."""
    upstreams = []
    if "engine" in names:
        blocks = -(-(PROMPT_TOKEN_BUDGET + engine_tokens) // 16) + 1
        kv_gib = max(0.25, 1.25 * streams * blocks * KV_BLOCK_BYTES / 2**30)
        engine = procs.start("engine", [
            "heteroserve_engines.cpu_engine", "--served-model-name", ENGINE_MODEL,
            "--max-model-len", str(MAX_MODEL_LEN), "--max-running", str(streams),
            "--max-waiting", str(4 * streams), "--kv-cache-gib", f"{kv_gib:.2f}",
            *(["--model", gguf] if gguf else [])],
            cpus=engine_cpus, env={"OMP_NUM_THREADS": str(len(engine_cpus)),
                                   "CUSTOM_CPU_AFFINITY": ",".join(map(str, sorted(engine_cpus)))})
        procs.wait("engine", f"http://127.0.0.1:{engine}/health")
        upstreams.append(("engine", ENGINE_MODEL, engine))
    if "canned" in names:
        canned = procs.start("canned", ["tests.fakes.canned_upstream"], cpus=engine_cpus)
        procs.wait("canned", f"http://127.0.0.1:{canned}/health")
        upstreams.append(("canned", "canned", canned))
    if "paced" in names:
        paced = procs.start("paced", ["tests.fakes.canned_upstream", "--token-delay",
                                      str(paced_token_delay), "--workers", str(len(engine_cpus))],
                            cpus=engine_cpus)
        procs.wait("paced", f"http://127.0.0.1:{paced}/health")
        upstreams.append(("paced", "canned", paced))
    targets = {}
    for name, model, port in upstreams:
        direct = f"http://127.0.0.1:{port}"
        config = router_config_file(procs.folder, f"router-{name}", model, direct, streams)
        # --port overrides the file's listen port.
        router_port = procs.start(f"router-{name}",
                                  ["heteroserve_engines.router", "--config", str(config)],
                                  cpus=router_cpus)
        procs.wait(f"router-{name}", f"http://127.0.0.1:{router_port}/ready")
        targets[name] = (direct, f"http://127.0.0.1:{router_port}", procs.pids[f"router-{name}"])
    return targets


# -- load --------------------------------------------------------------------------------------
@dataclass
class Level:
    ttfts: list[float]  # seconds, of the requests that completed
    tokens: int
    wall: float
    errors: list[str]
    cpu: float = math.nan  # the router's CPU seconds (user + system) per completed request
    own: list[float] = field(default_factory=list)  # the router's own time per request (its log)
    # The client's time to the first body bytes by the request's id upstream, and per request
    # that minus the upstream's own time from arrival to the first token (read_logs).
    ttfb: dict[str, float] = field(default_factory=dict)
    paired: list[float] = field(default_factory=list)
    # The load generator's own CPU time over the level's wall time (one asyncio loop: near 1.0
    # it, not the path, is what the TTFTs measure).
    client_cpu: float = math.nan

    def percentile(self, q: float) -> float:
        return nearest(self.ttfts, q)

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall


@dataclass
class Sample:
    """One request as the client saw it."""

    ttft: float | None  # to the first chunk with content
    tokens: int
    error: str
    ttfb: float | None = None  # to the response body's first bytes
    request_id: str = ""  # as the upstream saw it (x-request-id)


async def one_request(client: httpx.AsyncClient, url: str, body: bytes, max_tokens: int
                      ) -> Sample:
    start = time.perf_counter()
    # An id of our own, which the upstream logs beside its own time to the first token; a
    # router answers with the id it gave the request upstream instead.
    request_id = uuid.uuid4().hex[:16]
    first, count, usage, pending, ttfb = None, 0, None, b"", None

    def ended(error: str) -> Sample:
        return Sample(first and first - start, count, error, ttfb, request_id)

    try:
        async with client.stream("POST", url, content=body,
                                 headers={"content-type": "application/json",
                                          "x-request-id": request_id}) as response:
            request_id = response.headers.get("x-request-id", request_id)
            if response.status_code != 200:
                await response.aread()
                return Sample(None, 0, f"HTTP {response.status_code}")
            async for data in response.aiter_raw():
                if ttfb is None:
                    ttfb = time.perf_counter() - start
                pending += data
                cut = pending.rfind(b"\n\n")
                if cut < 0:
                    continue
                events, pending = pending[:cut], pending[cut + 2:]
                found = len(CONTENT.findall(events))
                if found and first is None:
                    first = time.perf_counter()
                count += found
                if b'"usage"' in events and (match := USAGE.search(events)):
                    usage = int(match[1])
                if ERROR in events:
                    return ended("error event")
    except httpx.HTTPError as error:
        return ended(type(error).__name__)
    count = count if usage is None else usage
    if first is None:
        return ended("no content")
    return ended("" if count == max_tokens else f"{count} tokens")


def request_body(model: str, max_tokens: int) -> bytes:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                       "stream": True, "stream_options": {"include_usage": True},
                       "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}).encode()


async def run_level(client: httpx.AsyncClient, base: str, model: str, max_tokens: int,
                    streams: int, requests: int) -> Level:
    return (await run_paths(client, [base], model, max_tokens, streams, requests))[0]


async def run_paths(client: httpx.AsyncClient, bases: list[str], model: str, max_tokens: int,
                    streams: int, requests: int, stagger: float = 0.0,
                    slot: tuple[int, int] = (0, 1)) -> list[Level]:
    """`streams` streams sending requests back to back until `requests` are done (at least one
    per stream). With two bases each stream alternates between them, request by request (streams
    start on alternate ones): both paths then meet the same upstream in the same state at once,
    half of the requests each. `stagger`: seconds over which the streams' first requests are
    spread evenly (0: all at once, a burst); `slot` = (this process's index, processes): with
    several load-generator processes, their streams interleave in that spread."""
    body = request_body(model, max_tokens)
    urls = [f"{base}/v1/chat/completions" for base in bases]
    total = max(streams, requests)
    issued = 0
    levels = [Level([], 0, 0.0, []) for _ in bases]

    async def stream(index: int) -> None:
        nonlocal issued
        turn = index
        if stagger:
            await asyncio.sleep(stagger * (index * slot[1] + slot[0]) / (streams * slot[1]))
        while issued < total:
            issued += 1
            path = turn % len(urls)
            turn += 1
            sample = await one_request(client, urls[path], body, max_tokens)
            level = levels[path]
            level.tokens += sample.tokens
            if sample.error:
                level.errors.append(sample.error)
            elif sample.ttft is not None:
                level.ttfts.append(sample.ttft)
                if sample.request_id and sample.ttfb is not None:
                    level.ttfb[sample.request_id] = sample.ttfb

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(stream(i) for i in range(streams)))
    for level in levels:
        level.wall = time.perf_counter() - start
        level.client_cpu = (time.process_time() - cpu) / level.wall
    return levels


def load_client() -> httpx.AsyncClient:
    """The load generator's client: httpx over the router's own plain-HTTP transport
    (router/transport.py: httptools parsing, one write per request). httpx's default transport
    costs about half a millisecond of the load generator's CPU per streamed chunk (seen on the GPU
    host: one loop at 100 % of its core relaying under 500 chunks/s), which at 64 and 256
    streams measured the client instead of the path. Both paths go through it alike."""
    # The transport keeps every connection it opens: the streams bound them.
    return httpx.AsyncClient(transport=UpstreamTransport(),
                             timeout=httpx.Timeout(300, connect=30))


def _worker_paths(bases: list[str], model: str, max_tokens: int, streams: int, requests: int,
                  barrier, stagger: float, slot: tuple[int, int]) -> list[Level]:
    """One load-generator process's share of a level: its own loop and client, warmed up
    (connections and first-request code paths), then waiting at `barrier` for every other
    process (and the parent, which reads the router's CPU there) before its streams start."""
    async def run() -> list[Level]:
        async with load_client() as client:
            for base in bases:
                await run_level(client, base, model, 1, streams, streams)
            barrier.wait()   # blocks this process's loop, which has nothing else to do
            return await run_paths(client, bases, model, max_tokens, streams, requests,
                                   stagger, slot)
    return asyncio.run(run())


class LoadGenerators:
    """Levels from as many processes as load-generator CPUs (on those CPUs), each its own
    asyncio loop and client, with the streams (and requests) shared out; with one CPU, levels
    run in this process."""

    def __init__(self, cpus: set[int], stagger: float = 0.0):
        self.cpus, self.stagger = sorted(cpus), stagger
        self.pool = self.manager = None
        if len(self.cpus) > 1:
            context = multiprocessing.get_context("spawn")
            self.manager = context.Manager()
            self.pool = concurrent.futures.ProcessPoolExecutor(
                len(self.cpus), mp_context=context,
                initializer=os.sched_setaffinity, initargs=(0, set(self.cpus)))

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()
        if self.manager:
            self.manager.shutdown()

    async def paths(self, client: httpx.AsyncClient, bases: list[str], model: str,
                    max_tokens: int, streams: int, requests: int,
                    on_start: Callable[[], None] = lambda: None) -> list[Level]:
        """`on_start` runs as the measured streams start (after every warm-up)."""
        if self.pool is None:
            on_start()
            return await run_paths(client, bases, model, max_tokens, streams, requests,
                                   self.stagger)
        count = len(self.cpus)
        shares = [share for i in range(count)
                  if (share := streams // count + (i < streams % count))]
        total = max(streams, requests)
        barrier = self.manager.Barrier(len(shares) + 1, timeout=600)
        loop = asyncio.get_running_loop()
        parts = asyncio.gather(*(
            loop.run_in_executor(self.pool, _worker_paths, bases, model, max_tokens, share,
                                 -(-total * share // streams), barrier, self.stagger,
                                 (index, len(shares)))
            for index, share in enumerate(shares)))
        await loop.run_in_executor(None, barrier.wait)
        on_start()
        merged = [Level([], 0, 0.0, []) for _ in bases]
        for part in await parts:
            for into, level in zip(merged, part, strict=True):
                into.ttfts += level.ttfts
                into.tokens += level.tokens
                into.errors += level.errors
                into.ttfb.update(level.ttfb)
                into.wall = max(into.wall, level.wall)
                into.client_cpu = level.client_cpu if math.isnan(into.client_cpu) else max(
                    into.client_cpu, level.client_cpu)   # the busiest process
        return merged


@dataclass
class Row:
    target: str
    streams: int
    direct: list[Level]
    router: list[Level]
    # Interleaved: (direct, router) halves of one run in which streams alternate the paths.
    mixed: list[tuple[Level, Level]] = field(default_factory=list)


# The router's log line of a request: its id (the one it sent upstream and answered the client
# with) and its own time.
OVERHEAD = re.compile(r"request ([0-9a-f]+) .*?overhead=([0-9.]+)ms")
UPSTREAM_LOGGED = re.compile(r"x-request-id=([0-9a-f]+) .*?first_token=([0-9.]+)ms")


def read_logs(router_log: Path | None, router_from: int, upstream_log: Path, upstream_from: int,
              level: Level) -> None:
    """From the logs' lines after the given offsets: the router's own time per request
    (`overhead=`: before its upstream request, and relaying the first bytes) into level.own
    (router levels), and per request the client's time to the first bytes minus the upstream's
    own time from the request's arrival to its first token (its log line carries the request's
    x-request-id) into level.paired. That removes the upstream's queueing and compute, which
    dominate and drift at 64-256 streams; what remains is the path: for a direct request the
    loopback hop and both event loops' delays, through the router also its hops, loop,
    processing and relay. The difference of the two paths' medians in one interleaved run is
    the router's added time."""
    if router_log is not None:
        with open(router_log, "rb") as log:
            log.seek(router_from)
            # The measured requests only (not the load-generator processes' warm-up requests).
            level.own = [float(v) for request_id, v in OVERHEAD.findall(log.read().decode())
                         if request_id in level.ttfb]
    with open(upstream_log, "rb") as log:
        log.seek(upstream_from)
        text = log.read().decode(errors="replace")
    for request_id, upstream in UPSTREAM_LOGGED.findall(text):
        if (client_ttfb := level.ttfb.get(request_id)) is not None:
            level.paired.append(client_ttfb - float(upstream) / 1e3)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far, all threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(targets: dict[str, tuple[str, str, int]], levels: list[int],
                  tokens: dict[str, int], requests: int, rounds: int,
                  client_cpus: dict[str, set[int]], folder: Path, stagger: float = 0.0,
                  per_stream: int = 0) -> list[Row]:
    rows = []
    async with load_client() as client:
        for target, (direct, router, router_pid) in targets.items():
            router_log, upstream_log = folder / f"router-{target}.log", folder / f"{target}.log"
            os.sched_setaffinity(0, client_cpus[target])
            generators = LoadGenerators(client_cpus[target], stagger)
            try:
                rows += await measure_target(client, generators, target, direct, router,
                                             router_pid, levels, tokens[target], requests,
                                             per_stream, rounds, router_log, upstream_log)
            finally:
                generators.close()
    return rows


async def measure_target(client: httpx.AsyncClient, generators: LoadGenerators, target: str,
                         direct: str, router: str, router_pid: int, levels: list[int],
                         tokens: int, base_requests: int, per_stream: int, rounds: int,
                         router_log: Path, upstream_log: Path) -> list[Row]:
    rows = []
    model = ENGINE_MODEL if target == "engine" else "canned"
    # Warm-up: first-request code paths, and connections for the widest level (client to
    # upstream or router, router to upstream). uvicorn closes a connection idle for 5 s, so a
    # later level may still open some: both paths alike.
    for base in (direct, router):
        await run_level(client, base, model, 1, max(levels), max(levels))
    for streams in levels:
        row = Row(target, streams, [], [])
        requests = max(base_requests, per_stream * streams)
        for _ in range(rounds):
            upstream_logged = upstream_log.stat().st_size
            [level] = await generators.paths(client, [direct], model, tokens, streams, requests)
            read_logs(None, 0, upstream_log, upstream_logged, level)
            row.direct.append(level)
            before = []
            logged, upstream_logged = router_log.stat().st_size, upstream_log.stat().st_size
            [level] = await generators.paths(
                client, [router], model, tokens, streams, requests,
                on_start=lambda before=before: before.append(cpu_seconds(router_pid)))
            # The router's CPU from the measured streams' start (after the load-generator
            # processes' warm-up requests) per measured request.
            done = len(level.ttfts)
            level.cpu = (cpu_seconds(router_pid) - before[0]) / done if done else math.nan
            read_logs(router_log, logged, upstream_log, upstream_logged, level)
            row.router.append(level)
            logged, upstream_logged = router_log.stat().st_size, upstream_log.stat().st_size
            halves = await generators.paths(client, [direct, router], model, tokens, streams,
                                            requests)
            read_logs(None, 0, upstream_log, upstream_logged, halves[0])
            read_logs(router_log, logged, upstream_log, upstream_logged, halves[1])
            row.mixed.append((halves[0], halves[1]))
        rows.append(row)
        print(f"  {target} x{streams}: done", file=sys.stderr, flush=True)
    return rows


# -- report ------------------------------------------------------------------------------------
def med(values) -> float:
    return statistics.median(values)


def nearest(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (NaN for none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def describe_machine() -> str:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = next(line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                   if line.startswith("Model name"))
    except (OSError, StopIteration):
        cpu = "unknown CPU"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           check=False, capture_output=True, text=True).stdout.strip()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return (f"{cpu}; nproc {len(os.sched_getaffinity(0))}; "
            f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}; "
            f"commit {commit}{' (modified)' if dirty else ''}; load average at start {load}")


def report(rows: list[Row], rounds: int, tokens: dict[str, int], machine: str,
           stagger: float = 0.0) -> None:
    sys.stderr.flush()
    stagger_text = f"spread over {stagger:g} s" if stagger else "all at once (a burst)"
    print(f"\n{machine}")
    print(f"medians of {rounds} round(s); streams start {stagger_text}; max_tokens: "
          + ", ".join(f"{name} {count}" for name, count in tokens.items())
          + "; TTFT to the first chunk with content\n")
    print("| upstream | streams | path | TTFT p50 ms | TTFT p99 ms | tok/s | throughput ratio "
          "| added TTFT p50 ms, interleaved | added TTFT p99 ms, interleaved "
          "| added TTFT p50 ms, separate runs | router CPU ms/request "
          "| router's own time p50 ms | router's own time p99 ms "
          "| added p50 ms, paired | added p99 ms, paired | load generator CPU % (max) "
          "| errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    verdicts: dict[str, list[str]] = {}
    for row in rows:
        for path, levels in (("direct", row.direct), ("router", row.router)):
            mixed = [pair[0 if path == "direct" else 1] for pair in row.mixed]
            errors = [e for level in [*levels, *mixed] for e in level.errors]
            shown = f"{len(errors)} ({', '.join(sorted(set(errors))[:3])})" if errors else "0"
            cells = [f"{1e3 * med(lv.percentile(0.5) for lv in levels):.1f}",
                     f"{1e3 * med(lv.percentile(0.99) for lv in levels):.1f}",
                     f"{med(lv.throughput for lv in levels):.0f}"]
            if path == "direct":
                cells += [""] * 9
            else:
                ratio = med(r.throughput / d.throughput
                            for d, r in zip(row.direct, row.router, strict=True))
                mixed50 = 1e3 * med(r.percentile(0.5) - d.percentile(0.5) for d, r in row.mixed)
                mixed99 = 1e3 * med(r.percentile(0.99) - d.percentile(0.99)
                                    for d, r in row.mixed)
                separate50 = 1e3 * med(r.percentile(0.5) - d.percentile(0.5)
                                       for d, r in zip(row.direct, row.router, strict=True))
                cpu = 1e3 * med(lv.cpu for lv in levels)
                own = [ms for lv in levels for ms in lv.own]
                own50 = statistics.median(own) if own else math.nan
                own99 = sorted(own)[max(0, math.ceil(0.99 * len(own)) - 1)] if own else math.nan
                # Paired: per request the path's time (the client's time to the first bytes
                # minus the upstream's own), router half minus direct half of each interleaved
                # run, median over rounds.
                paired50 = 1e3 * med(nearest(r.paired, 0.5) - nearest(d.paired, 0.5)
                                     for d, r in row.mixed)
                paired99 = 1e3 * med(nearest(r.paired, 0.99) - nearest(d.paired, 0.99)
                                     for d, r in row.mixed)
                cells += [f"{ratio:.2f}", f"{mixed50:+.1f}", f"{mixed99:+.1f}",
                          f"{separate50:+.1f}", f"{cpu:.2f}", f"{own50:.2f}", f"{own99:.2f}",
                          f"{paired50:+.2f}", f"{paired99:+.2f}"]
                notes = verdicts.setdefault(row.target, [])
                if not paired50 <= 2.0:
                    notes.append(f"added time p50 {paired50:.2f} ms (paired) at {row.streams} "
                                 "streams")
                if not mixed50 <= 2.0:
                    notes.append(f"(interleaved difference of the TTFT p50s {mixed50:+.1f} ms at "
                                 f"{row.streams} streams)")
                if row.streams == 256 and not ratio >= 0.90:
                    notes.append(f"throughput ratio {ratio:.2f} at 256 streams")
            busy = max(lv.client_cpu for lv in [*levels, *mixed])
            print(f"| {row.target} | {row.streams} | {path} | {' | '.join(cells)} "
                  f"| {100 * busy:.0f} | {shown} |")
    measured_256 = any(row.streams == 256 for row in rows)
    print("\ngoals: added TTFT p50 <= 2 ms at every level (paired: per request the client's "
          "time to the first bytes minus the upstream's own time from the request's arrival to "
          "its first token, router half minus direct half of the interleaved runs; the plain "
          "difference of their TTFT p50s is shown beside it); throughput "
          "ratio >= 0.90 at 256 streams" + ("" if measured_256 else " (256 streams not measured)"))
    for target, notes in verdicts.items():
        print(f"  {target}: {'met' if not notes else 'NOT met: ' + '; '.join(notes)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,64,256",
                        help="comma-separated stream counts")
    parser.add_argument("--tokens", type=int, default=64,
                        help="max_tokens per request to the CPU engine")
    parser.add_argument("--canned-tokens", type=int, default=256,
                        help="max_tokens per request to the canned upstream")
    parser.add_argument("--paced-tokens", type=int, default=32,
                        help="max_tokens per request to the paced canned upstream")
    parser.add_argument("--paced-token-delay", type=float, default=0.02,
                        help="seconds between the paced upstream's tokens of one stream")
    parser.add_argument("--requests-per-stream", type=int, default=0,
                        help="least requests per stream and level (with --requests, the larger "
                        "count): several keep every level's streams busy past its ramp")
    parser.add_argument("--stagger", type=float, default=0.0,
                        help="seconds over which each level's streams start (0: all at once, a "
                        "burst); about one request's duration gives steady arrivals")
    parser.add_argument("--targets", default="engine,canned,paced",
                        help="comma-separated upstreams to measure (engine, canned, paced)")
    parser.add_argument("--requests", type=int, default=16,
                        help="least requests per level (streams run requests back to back)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--router-cpus", default=None,
                        help="CPUs of the routers (default: the first allowed CPU when there are "
                        "two or more, else all)")
    parser.add_argument("--client-cpus", default=None,
                        help="CPUs of the load generator (default: with four or more CPUs, the "
                        "second one; else the router's for the engine rows and the upstreams' "
                        "for the canned rows)")
    parser.add_argument("--engine-cpus", default=None,
                        help="CPUs of the upstreams (default: every CPU left)")
    parser.add_argument("--model", default=None,
                        help="the CPU engine's GGUF (default: the embedded SmolLM2-135M)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one round at 1 and 8 streams, 8 requests")
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.rounds, args.requests = "1,8", 1, 8
    levels = [int(n) for n in args.concurrency.split(",")]
    if args.tokens + PROMPT_TOKEN_BUDGET > MAX_MODEL_LEN:
        parser.error(f"--tokens must be at most {MAX_MODEL_LEN - PROMPT_TOKEN_BUDGET}")
    names = tuple(dict.fromkeys(args.targets.split(",")))
    if not names or set(names) - {"engine", "canned", "paced"}:
        parser.error("--targets takes engine, canned and paced")
    tokens = {name: count for name, count in (("engine", args.tokens),
                                              ("canned", args.canned_tokens),
                                              ("paced", args.paced_tokens)) if name in names}
    allowed = sorted(os.sched_getaffinity(0))

    def cpus(text: str | None, default: set[int]) -> set[int]:
        return set(parse_cpu_list(text)) if text else default

    router_cpus = cpus(args.router_cpus, {allowed[0]} if len(allowed) > 1 else set(allowed))
    own_client = len(allowed) >= 4 or args.client_cpus
    client = cpus(args.client_cpus, {sorted(set(allowed) - router_cpus)[0]} if own_client
                  else set())
    engine_cpus = cpus(args.engine_cpus, set(allowed) - router_cpus - client or set(allowed))
    # With few CPUs the load generator sits beside the router for the engine (whose cores it
    # must not take) and beside the canned upstream for the canned target (the router, on its own
    # core, is what is measured there: its ceiling). With four or more it has a core of its own.
    client_cpus = ({"engine": client, "canned": client, "paced": client} if client
                   else {"engine": router_cpus, "canned": engine_cpus, "paced": engine_cpus})
    machine = describe_machine() + (
        f"; routers on CPUs {sorted(router_cpus)}, upstreams on {sorted(engine_cpus)}, load "
        f"generator on " + ", ".join(f"{sorted(client_cpus[name])} ({name} rows)"
                                     for name in names))
    with tempfile.TemporaryDirectory(prefix="router-overhead-") as folder:
        procs = Processes(Path(folder))
        try:
            targets = start_all(procs, max(levels), args.tokens, engine_cpus, router_cpus,
                                args.model, names, args.paced_token_delay)
            rows = asyncio.run(measure(targets, levels, tokens, args.requests, args.rounds,
                                       client_cpus, procs.folder, args.stagger,
                                       args.requests_per_stream))
        finally:
            procs.stop()
    report(rows, args.rounds, tokens, machine, args.stagger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
