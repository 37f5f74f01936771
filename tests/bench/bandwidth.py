"""The last-level cache and a read-bandwidth probe over a buffer at least 4x larger than it.

    .venv/bin/python -m tests.bench.bandwidth [--threads N]

A decode roofline (read bandwidth / weight bytes read per token) means something only where both
the probe's buffer and the model are much larger than the last-level cache: a model that partly
fits is read partly from the cache and can beat a bandwidth measured over memory (issue 12 saw
"123 % of the roofline" that way). `llc_bytes` is the cache the machine reports (sysfs, every
distinct L3 instance summed, the size a virtual machine is shown: often the host socket's), and
`valid` is the rule every percentage of the benchmarks goes through. The probe is the engine's own
(`heteroserve_cpu.read_bandwidth`: pinned threads each summing their slice, best of 5, on the
pages the weights use), run here in its own process over max(1 GiB, 4x the cache), and a second,
independent one (`numpy_probe`: one pinned process per thread, each summing its slice with numpy's
SIMD reduction, the rounds timed from the first start to the last end, best of 5). The roofline
uses the higher of the two: a probe that reads slower than an engine decodes (llama.cpp reached
109 % of the engine's probe alone on the 8B shape) understates the ceiling.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

FACTOR = 4  # a buffer or a model counts as "far larger than the cache" at 4x its size


def _size(text: str) -> int:
    text = text.strip().upper()
    for suffix, scale in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if text.endswith(suffix):
            return int(text[:-1]) * scale
    return int(text)


def llc_bytes() -> int:
    """Total last-level cache: each distinct instance of the highest cache level, summed."""
    best_level, seen = 0, {}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            if (index / "type").read_text().strip() == "Instruction":
                continue
            key = (index / "shared_cpu_list").read_text().strip()
            size = _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if level > best_level:
            best_level, seen = level, {}
        if level == best_level:
            seen[key] = size
    return sum(seen.values())


def valid(nbytes: float, llc: int) -> bool:
    """Whether a buffer or a model of `nbytes` is large enough for a roofline figure."""
    return llc > 0 and nbytes >= FACTOR * llc


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


def probe_bytes(llc: int) -> int:
    return max(1 << 30, -(-FACTOR * llc // (1 << 30)) * (1 << 30))


def probe(threads: int, env: dict | None = None) -> dict:
    """Read bandwidth over max(1 GiB, 4x the cache), measured in a child process (the engine's
    probe, pinned threads, the huge-page policy of `env`)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "tests.bench.bandwidth", "--threads",
                          str(threads)], capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numpy_part(cpu: int, words: int, rounds: int, barrier, times) -> None:
    import numpy as np

    os.sched_setaffinity(0, {cpu})
    if os.environ.get("HETEROSERVE_HUGEPAGES") == "0":  # the engines' page policy
        core = getattr(np, "_core", None) or np.core
        core.multiarray._set_madvise_hugepage(False)
    part = np.ones(words, dtype=np.float64)
    part.sum()
    for r in range(rounds):
        barrier.wait()
        start = time.perf_counter()
        part.sum()
        times.put((r, start, time.perf_counter()))


def numpy_probe(threads: int, nbytes: int, rounds: int = 5) -> float:
    """GB/s read by `threads` pinned processes summing their slices of `nbytes` together."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    threads = len(cpus)
    barrier, times = ctx.Barrier(threads), ctx.Queue()
    words = nbytes // 8 // threads
    procs = [ctx.Process(target=_numpy_part, args=(cpu, words, rounds, barrier, times))
             for cpu in cpus]
    for p in procs:
        p.start()
    spans: dict[int, list[float]] = {}
    for _ in range(rounds * threads):
        r, start, end = times.get()
        spans.setdefault(r, []).extend((start, end))
    for p in procs:
        p.join()
    return max(words * 8 * threads / (max(s) - min(s)) / 1e9 for s in spans.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    import heteroserve_cpu as hc

    llc = llc_bytes()
    size = probe_bytes(llc)
    numpy = numpy_probe(args.threads, size)  # first: the engine's pool pins this process
    cpus = sorted(os.sched_getaffinity(0))[:args.threads]
    pool = hc.Pool(cpus, args.threads, pin_caller=True)
    engine = hc.read_bandwidth(pool, size, 5)
    print(json.dumps({"gbs": max(engine, numpy), "engine_gbs": engine, "numpy_gbs": numpy,
                      "buffer_bytes": size, "llc_bytes": llc, "valid": valid(size, llc)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
