"""The last-level cache and a read-bandwidth probe over a buffer at least 4x larger than it.

    .venv/bin/python -m tests.bench.bandwidth [--threads N]

A decode roofline (read bandwidth / weight bytes read per token) means something only where both
the probe's buffer and the model are much larger than the last-level cache: a model that partly
fits is read partly from the cache and can beat a bandwidth measured over memory (issue 12 saw
"123 % of the roofline" that way). `llc_bytes` is the cache the machine reports (sysfs, every
distinct L3 instance summed, the size a virtual machine is shown: often the host socket's), and
`valid` is the rule every percentage of the benchmarks goes through. The probe is the engine's own
(`heteroserve_cpu.read_bandwidth`: pinned threads each summing their slice, best of 5, on the
pages the weights use), run here in its own process over max(1 GiB, 4x the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    import heteroserve_cpu as hc

    llc = llc_bytes()
    size = probe_bytes(llc)
    cpus = sorted(os.sched_getaffinity(0))[:args.threads]
    pool = hc.Pool(cpus, args.threads, pin_caller=True)
    gbs = hc.read_bandwidth(pool, size, 5)
    print(json.dumps({"gbs": gbs, "buffer_bytes": size, "llc_bytes": llc,
                      "valid": valid(size, llc)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
