"""Batch-1 decode deep into a context, CPU engine vs llama.cpp's llama-bench (a script, not a test).

    .venv/bin/python -m tests.bench.cpu_engine_long_context --llama-bin DIR [--ik-llama-bin DIR]
        [--threads N] [--depths 512,2048] [--pairs 3] [--model PATH ...] [--baseline REV]

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

With `--ik-llama-bin DIR` ik_llama.cpp is a second peer, as in cpu_engine_vs_llamacpp (run-time
repacking, `-mmp 0 -rtr 1`, its flash attention on by default). Its llama-bench has no `-d`; its
`-gp D,16` is the same measure (a prompt of D tokens by prefill, then the 16 decoded tokens
alone timed). Each pair becomes a triple, and the ratio row is heteroserve against the better
peer at each depth (the higher median, named in the cell).
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
    IK_BENCH,
    bench_env,
    better_peer,
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


def ik_rates(rows: list[dict], depths: list[int]) -> dict[int, float]:
    """{depth: tok/s} from ik_llama.cpp's llama-bench JSON rows of `-gp DEPTH,STEPS` tests
    (`n_prompt` the depth, `avg_ts` the decoded tokens alone); a depth without its row is an
    error, not a gap in the table."""
    got = {int(r["n_prompt"]): float(r["avg_ts"]) for r in rows if int(r["n_gen"]) == STEPS}
    missing = [d for d in depths if d not in got]
    if missing:
        raise RuntimeError(f"ik_llama.cpp's llama-bench reported no tg{STEPS}@pp row for depths "
                           f"{missing}: {json.dumps(rows)[:2000]}")
    return {d: got[d] for d in depths}


def ik_bench(bin_dir: str, model: str, threads: int, depths: list[int],
             env: dict) -> dict[int, float]:
    gp = [a for d in depths for a in ("-gp", f"{d},{STEPS}")]
    out, _, _ = run_sampled([f"{bin_dir}/llama-bench", "-m", model, "-t", str(threads), "-p", "0",
                             "-n", "0", *gp, "-r", "1", "-o", "json", *IK_BENCH], env)
    return ik_rates(json.loads(out), depths)


def table(rows: list, depths: list[int]) -> list[str]:
    """The markdown table of the medians: each engine's rates, then heteroserve (and each
    baseline build) against the better peer at each depth, then heteroserve against each
    baseline build. `rows`: (model name, {engine: [one {depth: tok/s} per pair]}), the peers
    first."""
    short = {"llama.cpp": " vs llama.cpp", "ik_llama.cpp": " vs ik"}
    out = ["| model | engine | " + " | ".join(f"depth {d}" for d in depths) + " |",
           "|---|---|" + "---|" * len(depths)]
    for name, samples in rows:
        peers = [e for e in samples if e in short]
        ours = [e for e in samples if e not in short]
        for engine in samples:
            out.append(f"| {name} | {engine} | " + " | ".join(
                f"{statistics.median(s[d] for s in samples[engine]):.1f}" for d in depths) + " |")
        against = "llama.cpp" if peers == ["llama.cpp"] else "better peer"
        for engine in ours:
            cells = []
            for d in depths:
                best = better_peer(samples, d)
                cells.append(ratio_cell([s[d] for s in samples[engine]],
                                        [s[d] for s in samples[best]],
                                        short[best] if len(peers) > 1 else ""))
            out.append(f"| {name} | {engine} / {against} (pair range) | " + " | ".join(cells)
                       + " |")
        for engine in ours[1:]:
            out.append(f"| {name} | heteroserve / {engine} (pair range) | " + " | ".join(
                ratio_cell([s[d] for s in samples["heteroserve"]],
                           [s[d] for s in samples[engine]]) for d in depths) + " |")
    return out


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
    parser.add_argument("--ik-llama-bin", help="folder of ik_llama.cpp's llama-bench (a second "
                        "peer; the ratio is against the better of the two at each depth)")
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
    peers = {"llama.cpp": args.llama_bin}
    if args.ik_llama_bin:
        peers["ik_llama.cpp"] = args.ik_llama_bin
    rows = []
    for path in models:
        samples: dict[str, list[dict[int, float]]] = {**{p: [] for p in peers},
                                                      **{e: [] for e in engines}}
        for i in range(args.pairs):  # the order rotating from pair to pair (cpu_engine_vs_llamacpp)
            for engine in rotated(samples, i):
                samples[engine].append(
                    llama_bench(args.llama_bin, path, args.threads, depths, env)
                    if engine == "llama.cpp" else
                    ik_bench(args.ik_llama_bin, path, args.threads, depths, env)
                    if engine == "ik_llama.cpp" else
                    heteroserve_sample(path, args.threads, args.depths,
                                       baseline.env_for(env, engines[engine])))
        rows.append((os.path.basename(path), samples))
    print("\n" + header(args.threads, args.pairs, policy, build_description(args.llama_bin),
                        f"; batch-1 decode tok/s after filling the context to each depth, "
                        f"{STEPS} tokens",
                        build_description(args.ik_llama_bin) if args.ik_llama_bin else None)
          + "\n")
    print("\n".join(table(rows, depths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
