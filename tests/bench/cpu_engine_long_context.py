"""Batch-1 decode deep into a context, CPU engine vs llama.cpp's llama-bench (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_long_context --llama-bin DIR [--threads N]
        [--depths 512,2048] [--pairs 3] [--model PATH ...] [--baseline REV]

The main benchmark (cpu_engine_vs_llamacpp) decodes from the first positions of each sequence;
here one sequence is first filled to each depth, then 16 tokens are decoded and timed (tok/s). The
peer is llama.cpp's own `llama-bench -p 0 -n 16 -d DEPTHS -r 1 -lm none` (it fills the context by
prefill, as heteroserve does here in chunks of 256, then times the decode). The fairness rules of
cpu_engine_vs_llamacpp apply: one process per sample, the engines alternating in an order that
rotates from pair to pair (llama.cpp first in the first), medians over `--pairs` pairs with the
per-pair ratio range beside each ratio, the same huge-page policy for both. Default models:
SmolLM2-135M q4_0 and the synthetic 1.1B q4_0 of the main benchmark. With `--baseline REV` the
CPU engine of revision REV (tests/bench/baseline.py) runs too, third in the first round, and a
row gives the working tree's rate over REV's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from tests.bench import baseline
from tests.bench.cpu_engine_vs_llamacpp import (
    bench_env,
    build_description,
    header,
    open_heteroserve,
    prompt_tokens,
    quantized_smollm2,
    ratio_cell,
    rotated,
    run_sampled,
    synthetic,
)

STEPS, CHUNK = 16, 256


def rates(run, vocab: int, depths: list[int]) -> dict[int, float]:
    """Batch-1 decode tok/s after filling one sequence to each depth (one warm-up step first,
    as llama-bench's warm-up; later positions overwrite earlier ones)."""
    prompt = prompt_tokens(max(depths), vocab, 7)
    out = {}
    run(prompt[:1], [0], [0], [0])
    for depth in depths:
        for c0 in range(0, depth, CHUNK):
            c1 = min(depth, c0 + CHUNK)
            nxt = run(prompt[c0:c1], range(c0, c1), [0] * (c1 - c0), [c1 - c0 - 1])
        start = time.perf_counter()
        for step in range(STEPS):
            nxt = run(nxt, [depth + step], [0], [0])
        out[depth] = STEPS / (time.perf_counter() - start)
    return out


def worker(model_path: str, threads: int, depths: list[int]) -> dict[int, float]:
    baseline.use()
    _model, _pool, config, run = open_heteroserve(model_path, threads, max(depths) + STEPS + 16, 1)
    return rates(run, config.n_vocab, depths)


def llama_bench(bin_dir: str, model: str, threads: int, depths: list[int],
                env: dict) -> dict[int, float]:
    out, _, _ = run_sampled([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads), "-p", "0",
                             "-n", str(STEPS), "-d", ",".join(map(str, depths)), "-r", "1",
                             "-o", "json", "-lm", "none"], env)
    return {row["n_depth"]: row["avg_ts"] for row in json.loads(out)}


def heteroserve_sample(model: str, threads: int, depths: str, env: dict) -> dict[int, float]:
    out, _, _ = run_sampled([sys.executable, "-m", "tests.bench.cpu_engine_long_context",
                             "--worker", "--model", model, "--threads", str(threads),
                             "--depths", depths], env)
    return {int(k): v for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--depths", default="32,512,1024,2048,3072")
    parser.add_argument("--model", action="append", help="GGUF file (repeatable)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--llama-bin", help="folder of llama.cpp's llama-bench (the peer)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the CPU engine of this git revision (before/after)")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    depths = sorted(int(d) for d in args.depths.split(","))
    if args.worker:
        print(json.dumps(worker(args.model[0], args.threads, depths)))
        return 0
    if not args.llama_bin:
        parser.error("--llama-bin is required (llama.cpp's llama-bench is the peer)")
    env, policy = bench_env()
    engines = {"heteroserve": None}
    if args.baseline:
        short, folder = baseline.build(args.baseline)
        engines[f"heteroserve {short}"] = folder
    models = args.model or [str(quantized_smollm2("q4_0")), str(synthetic("1.1b", "q4_0"))]
    rows = []
    for path in models:
        samples: dict[str, list[dict[int, float]]] = {"llama.cpp": [], **{e: [] for e in engines}}
        for i in range(args.pairs):  # the order rotating from pair to pair (cpu_engine_vs_llamacpp)
            for engine in rotated(samples, i):
                samples[engine].append(
                    llama_bench(args.llama_bin, path, args.threads, depths, env)
                    if engine == "llama.cpp" else
                    heteroserve_sample(path, args.threads, args.depths,
                                       baseline.env_for(env, engines[engine])))
        rows.append((os.path.basename(path), samples))
    print("\n" + header(args.threads, args.pairs, policy, build_description(args.llama_bin),
                        f"; batch-1 decode tok/s after filling the context to each depth, "
                        f"{STEPS} tokens") + "\n")
    print("| model | engine | " + " | ".join(f"depth {d}" for d in depths) + " |")
    print("|---|---|" + "---|" * len(depths))
    for name, samples in rows:
        for engine in samples:
            print(f"| {name} | {engine} | " + " | ".join(
                f"{statistics.median(s[d] for s in samples[engine]):.1f}" for d in depths) + " |")
        for engine in samples:
            if engine == "llama.cpp":
                continue
            print(f"| {name} | {engine} / llama.cpp (pair range) | " + " | ".join(
                ratio_cell([s[d] for s in samples[engine]],
                           [s[d] for s in samples["llama.cpp"]]) for d in depths) + " |")
        for engine in list(samples)[2:]:
            print(f"| {name} | heteroserve / {engine} (pair range) | " + " | ".join(
                ratio_cell([s[d] for s in samples["heteroserve"]],
                           [s[d] for s in samples[engine]]) for d in depths) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
