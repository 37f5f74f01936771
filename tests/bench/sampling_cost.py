"""Whether cpu_engine_vs_llamacpp's memory sampling costs heteroserve speed (a script, not a
test): the benchmark's own heteroserve worker (`--worker`, one process, the model's SETTINGS),
run alternately under the parent's sampler (run_sampled: the worker's RssAnon and the machine's
AnonHugePages read every 0.1 s) and plainly (no sampler), PAIRS times, the order rotating;
prints each process's batch-1, 8- and 16-sequence decode rates, then the medians.

    .venv/bin/python -m tests.bench.sampling_cost [--model 1.1b:q4_0] [--pairs 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from tests.bench.cpu_engine_vs_llamacpp import (
    add_model_options,
    bench_env,
    model_arg,
    run_sampled,
    settings_for,
)

KEYS = ("decode_1", "decode_8", "decode_16")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_options(ap, default="1.1b:q4_0")
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.threads < 1:
        ap.error("--pairs and --threads must be 1 or more")
    label, path = model_arg(ap, args.model, args.tokenizer)
    env, policy = bench_env()
    cmd = [sys.executable, "-m", "tests.bench.cpu_engine_vs_llamacpp", "--worker", "--model",
           str(path), "--threads", str(args.threads), "--settings",
           json.dumps(settings_for(args.model))]
    runs: dict[str, list[dict]] = {"sampled": [], "plain": []}
    print(f"{label}, {args.threads} threads, {policy}")
    for i in range(args.pairs):
        for how in (("sampled", "plain") if i % 2 == 0 else ("plain", "sampled")):
            if how == "sampled":
                out = run_sampled(cmd, env)[0]
            else:
                out = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                     check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            runs[how].append(result)
            rates = "  ".join(f"{k} {result[k]:.1f}" for k in KEYS)
            print(f"pair {i + 1} {how:7s} {rates} tok/s", flush=True)
    print("\n| worker | " + " | ".join(f"{k} (median, tok/s)" for k in KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    for how, results in runs.items():
        cells = " | ".join(f"{statistics.median(r[k] for r in results):.1f}" for k in KEYS)
        print(f"| {how} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
