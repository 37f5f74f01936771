"""Batch-1 decode deep into a context, CPU engine vs llama.cpp (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_long_context [--threads N] [--depths 32,2048]
        [--model PATH ...] [--llama-bin DIR]

The main benchmark (cpu_engine_vs_llamacpp) decodes 32-48 positions into each sequence; here one
sequence is first filled to each depth (prefill in chunks of 256), then 16 greedy tokens are
decoded and timed: tok/s, median of 3. Same machine, same GGUF file, same thread count, each
engine in its own process. The peer is llama.cpp through llama-cpp-python, or, with --llama-bin,
its own `llama-bench -n 16 -d DEPTHS` (where llama-cpp-python is not installed: the device
host). Default models: SmolLM2-135M q4_0 and the synthetic 1.1B q4_0 of the main benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from tests.bench.cpu_engine_vs_llamacpp import (
    open_heteroserve,
    open_llamacpp,
    prompt_tokens,
    quantized_smollm2,
    synthetic,
)

STEPS, CHUNK = 16, 256


def rates(run, reset, vocab: int, depths: list[int]) -> dict[int, float]:
    """Batch-1 decode tok/s after filling one sequence to each depth."""
    prompt = prompt_tokens(max(depths), vocab, 7)
    out = {}
    for depth in depths:
        samples = []
        for _ in range(3):
            reset()
            for c0 in range(0, depth, CHUNK):
                c1 = min(depth, c0 + CHUNK)
                nxt = run(prompt[c0:c1], range(c0, c1), [0] * (c1 - c0), [c1 - c0 - 1])
            start = time.perf_counter()
            for step in range(STEPS):
                nxt = run(nxt, [depth + step], [0], [0])
            samples.append(STEPS / (time.perf_counter() - start))
        out[depth] = statistics.median(samples)
    return out


def worker(engine: str, model_path: str, threads: int, depths: list[int]) -> dict[int, float]:
    context = max(depths) + STEPS + 16
    if engine == "heteroserve":
        _model, _pool, config, run = open_heteroserve(model_path, threads, context, 1)
        return rates(run, lambda: None, config.n_vocab, depths)
    run, reset, vocab, free = open_llamacpp(model_path, threads, context, 1)
    try:
        return rates(run, reset, vocab, depths)
    finally:
        free()


def llama_bench(bin_dir: str, model: str, threads: int, depths: list[int]) -> dict[int, float]:
    out = subprocess.run([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads), "-p", "0",
                          "-n", str(STEPS), "-d", ",".join(map(str, depths)), "-r", "3",
                          "-o", "json"], capture_output=True, text=True, check=True)
    return {row["n_depth"]: row["avg_ts"] for row in json.loads(out.stdout)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--depths", default="32,512,1024,2048,3072")
    parser.add_argument("--model", action="append", help="GGUF file (repeatable)")
    parser.add_argument("--llama-bin", help="llama.cpp's llama-bench from this folder as the peer")
    parser.add_argument("--worker", choices=["heteroserve", "llama.cpp"])
    args = parser.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    if args.worker:
        print(json.dumps(worker(args.worker, args.model[0], args.threads, depths)))
        return 0
    models = args.model or [str(quantized_smollm2("q4_0")), str(synthetic("1.1b", "q4_0"))]
    print(f"\nthreads: {args.threads}; batch-1 decode tok/s after filling the context to each "
          f"depth, {STEPS} tokens, median of 3\n")
    print("| model | engine | " + " | ".join(f"depth {d}" for d in depths) + " |")
    print("|---|---|" + "---|" * len(depths))
    for path in models:
        measured = {}
        for engine in ("llama.cpp", "heteroserve"):
            if engine == "llama.cpp" and args.llama_bin:
                measured[engine] = llama_bench(args.llama_bin, path, args.threads, depths)
                continue
            out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_long_context",
                                  "--worker", engine, "--model", path, "--threads",
                                  str(args.threads), "--depths", args.depths],
                                 capture_output=True, text=True, check=True)
            measured[engine] = {int(k): v for k, v in
                                json.loads(out.stdout.strip().splitlines()[-1]).items()}
        name = os.path.basename(path)
        for engine in ("llama.cpp", "heteroserve"):
            print(f"| {name} | {engine} | "
                  + " | ".join(f"{measured[engine][d]:.1f}" for d in depths) + " |")
        print(f"| {name} | ratio | " + " | ".join(
            f"{measured['heteroserve'][d] / measured['llama.cpp'][d]:.2f}x" for d in depths) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
