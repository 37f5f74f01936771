"""The pool's spin settings A/B (a script, not a test): batch-1 decode of one model with each
`--spins` entry in processes of their own, the entries alternating (A B, B A, ...) `--repeats`
times, and beside each process the share of all CPU time the hypervisor stole while it ran
(`/proc/stat`'s steal column, as tests/bench/cpu_steal.sh reads it).

    .venv/bin/python -m tests.bench.cpu_engine_spin_ab [--model SPEC] [--threads N]
        [--tokenizer JSON] [--spins default,200/0] [--repeats 5] [--runs 3] [--tokens 64]
        [--seconds 4]

`--spins` entries as in tests/bench/cpu_engine_shared_cores.py: `default` (the pool's own), `S`
(HETEROSERVE_POOL_SPIN_US=S) or `S/A` (also HETEROSERVE_POOL_SPIN_ALONE_US=A; `200/0` is the pool
before its long spin). Each process: the model loaded, a 32-token prompt, then `--runs` runs of
`--tokens` greedy tokens (a run ends early after `--seconds`), pinned to the first N CPUs, 4 KiB
pages (HETEROSERVE_HUGEPAGES=0, as in the llama.cpp comparison). Per entry: the median of the
processes' tok/s (each process's own median of its runs) and their range, the pool's parked
waits a token (`Pool.parks`) and the stolen share, median and range. A slowed host (the
nineteenth round's) shows up as processes at a fraction of the others' rate with many parks a
token and a stolen share well above zero.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from tests.bench.cpu_engine_shared_cores import spin_env, worker
from tests.bench.cpu_engine_vs_llamacpp import add_model_options, model_arg, rotated


def stat_times() -> tuple[int, int]:
    """(steal, all) jiffies over every CPU, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return fields[7], sum(fields)


def measure(args, path: str, spin: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROSERVE_POOL_SPIN")}
    env.update(spin_env(spin), HETEROSERVE_HUGEPAGES="0")
    steal0, all0 = stat_times()
    out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_spin_ab", "--worker",
                          "--path", path, "--threads", str(args.threads), "--runs",
                          str(args.runs), "--tokens", str(args.tokens), "--seconds",
                          str(args.seconds)], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    steal1, all1 = stat_times()
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["steal"] = 100.0 * (steal1 - steal0) / max(all1 - all0, 1)
    return r


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(parser, default="1.1b:q4_0")
    parser.add_argument("--spins", default="default,200/0")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.path, args.threads, args.runs, args.tokens, args.seconds)))
        return 0
    spins = args.spins.split(",")
    for spin in spins:
        spin_env(spin)  # a bad entry stops here, before anything runs
    if min(args.repeats, args.runs, args.tokens, args.threads) < 1:
        parser.error("--repeats, --runs, --tokens and --threads must be at least 1")
    label, path = model_arg(parser, args.model, args.tokenizer)
    results: dict[str, list[dict]] = {s: [] for s in spins}
    print(f"\n{label}, {args.threads} threads: batch-1 decode, {args.repeats} processes an entry "
          f"in alternation, each {args.runs} runs of {args.tokens} tokens\n", flush=True)
    for i in range(args.repeats):
        for spin in rotated(spins, i):
            r = measure(args, str(path), spin)
            results[spin].append(r)
            print(f"  process {i + 1}, spin {spin}: {r['rate']:.1f} tok/s, {r['parks']:.1f} "
                  f"parks a token, {r['steal']:.2f} % stolen", flush=True)
    print("\n| pool spin (µs) | tok/s, median | range | parks a token | stolen % of all CPU "
          "time |")
    print("|---|---|---|---|---|")
    for spin in spins:
        rates = [r["rate"] for r in results[spin]]
        parks = [r["parks"] for r in results[spin]]
        steal = [r["steal"] for r in results[spin]]
        print(f"| {spin} | {statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} | "
              f"{statistics.median(parks):.1f} ({min(parks):.1f}-{max(parks):.1f}) | "
              f"{statistics.median(steal):.2f} ({min(steal):.2f}-{max(steal):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
