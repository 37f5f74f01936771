"""The CPU engine's own configurations side by side (a script, not a test): model steps per second
at 1, 4, 8 and 16 sequences for each kernel variant, with and without transparent huge pages.

    .venv/bin/python -m tests.bench.cpu_engine_variants --model PATH [--threads N]
        [--variants amx,avx512vnni] [--hugepages 1,0] [--nrc 0,1,2,4]

Each configuration runs in its own process (HETEROSERVE_KERNELS / HETEROSERVE_HUGEPAGES / NRC set),
pinned to the first N CPUs. A step: one token for each of the sequences, 32 positions into their
context, logits for all of them; 16 steps, tokens/s, median of 3. This is where the claims of
docs/benchmarks.md about one variant against another come from; llama.cpp is compared in
cpu_engine_vs_llamacpp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

BATCHES = (1, 4, 8, 16)
STEPS = 16


def worker(path: str, threads: int) -> dict:
    import heteroserve_cpu as hc

    from heteroserve_engines.cpu_engine.gguf_model import load_model

    pool = hc.Pool(sorted(os.sched_getaffinity(0))[:threads], threads, pin_caller=True)
    model, _config, _ = load_model(path, pool, nrc=int(os.environ.get("NRC") or "0"))
    per_seq = 8  # blocks of 16 positions
    model.alloc_kv(16 * per_seq, 16)
    tables = np.arange(16 * per_seq, dtype=np.int32).reshape(16, per_seq)
    rng = np.random.default_rng(0)
    results = {"variant": hc.selected_variant()}
    for batch in BATCHES:
        seqs = np.arange(batch, dtype=np.int32)
        prompt = rng.integers(100, 30000, 32 * batch).astype(np.int32)
        model.forward(prompt, np.tile(np.arange(32, dtype=np.int32), batch), np.repeat(seqs, 32),
                      tables, seqs * 32 + 31)
        rates = []
        for _ in range(3):
            start = time.perf_counter()
            for step in range(STEPS):
                model.forward(prompt[:batch], np.full(batch, 32 + step, np.int32), seqs, tables,
                              seqs)
            rates.append(batch * STEPS / (time.perf_counter() - start))
        results[str(batch)] = statistics.median(rates)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--variants", default="")
    parser.add_argument("--hugepages", default="1,0")
    parser.add_argument("--nrc", default="0", help="rows per one-token product (0: by width)")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.model, args.threads)))
        return 0
    import heteroserve_cpu as hc

    variants = args.variants.split(",") if args.variants else [hc.selected_variant()]
    print(f"\nthreads: {args.threads}; model: {args.model}; tokens/s, median of 3\n")
    print("| variant | huge pages | NRC | " + " | ".join(f"{b} seq" for b in BATCHES) + " |")
    print("|---|---|---|" + "---|" * len(BATCHES))
    for variant in variants:
        for huge in args.hugepages.split(","):
            for nrc in args.nrc.split(","):
                env = dict(os.environ, HETEROSERVE_KERNELS=variant, HETEROSERVE_HUGEPAGES=huge,
                           NRC=nrc)
                out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_variants",
                                      "--worker", "--model", args.model, "--threads",
                                      str(args.threads)], env=env, capture_output=True,
                                     text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                if r["variant"] != variant:
                    raise SystemExit(f"{variant} is not available here (got {r['variant']})")
                print(f"| {variant} | {'on' if huge != '0' else 'off'} | "
                      f"{nrc if nrc != '0' else 'by width'} | "
                      + " | ".join(f"{r[str(b)]:.1f}" for b in BATCHES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
