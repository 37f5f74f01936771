"""Where a CPU engine step spends its time (a script, not a test): per-phase wall time of the
engine's own steps (the model's profiling counters: embed, norm, qkv, rope_kv, attention, o_proj,
gate_up, swiglu, down, logits) for prefill and for decode steps of 1, 8 and 16 sequences, and the
step rate, for each configuration side by side.

    .venv/bin/python -m tests.bench.cpu_engine_profile --model SPEC [--threads N]
        [--configs amx,avx512vnni] [--prompts 256,2048] [--batches 1,8,16] [--tokenizer JSON]
        [--baseline REV] [--repeats N] [--depth D]

SPEC as in cpu_engine_vs_llamacpp (`smollm2:q4_0`, `1.1b:q4_0`, `8b:q8_0`, ...). A configuration
is a kernel variant, optionally with `@N` (HETEROSERVE_WIDE_MIN=N: activation rows from which the
products go to the matrix unit), e.g. `amx@16`; each runs in its own process pinned to the first N
CPUs, on 4 KiB pages (HETEROSERVE_HUGEPAGES=0, as in the llama.cpp comparison). Prefill: one
warm-up, then the prompt in one call (the engine runs it in sub-steps of 128 tokens); decode:
`--steps` steps of each batch, each sequence 32 positions in (`--depth D`: D positions in, each
sequence's first D positions filled by prefill in chunks of 256 first: long-context decode, the
attention over D positions). Figures: milliseconds per call
(prefill) or per step (decode) for each phase, "other" being the step minus its phases (Python,
sampling, the call itself); and for batched decode steps the strips (16 weight rows) of their
products a thread took from another's share once its own were done (model.c's work stealing:
how unevenly the threads got through their shares), of all the step's strips.

Before/after: `--baseline REV` runs every configuration also on the CPU engine of revision REV
(tests/bench/baseline.py builds it once into ~/.cache/heteroserve/baseline), the two builds in
alternating processes `--repeats` times, the order rotating from repeat to repeat (working tree
then REV, REV then working tree, ...: neither always runs first); the table gives
each phase's median over the repeats, the row labelled with the build, and beside the rate
its range over the processes (the slowest's to the fastest's): where two builds' ranges
overlap, the A/B has not separated them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from array import array

from tests.bench import baseline
from tests.bench.cpu_engine_vs_llamacpp import model_path, prompt_tokens, rotated


def worker(path: str, threads: int, prompts: list[int], batches: list[int], steps: int,
           depth: int = 32) -> dict:
    baseline.use()
    import heteroserve_cpu as hc

    from heteroserve_engines.cpu_engine.gguf_model import load_model

    pool = hc.Pool(sorted(os.sched_getaffinity(0))[:threads], threads, pin_caller=True)
    model, config, _ = load_model(path, pool)
    sequences = max(batches, default=1)
    per_seq = -(-(max(max(prompts, default=0), depth) + 64) // 16)
    model.alloc_kv(per_seq * sequences, 16)
    tables = memoryview(array("i", range(per_seq * sequences))).cast("B").cast(
        "i", (sequences, per_seq))

    def run(tokens, positions, seqs, logits_at):
        rows = len(logits_at)
        return model.sample(array("i", tokens), array("i", positions), array("i", seqs), tables,
                            array("i", logits_at), [0.0] * rows, [0] * rows, [1.0] * rows,
                            [0] * rows)[0]

    def strips():  # (all, taken from another thread) so far; None: a build before them
        return getattr(model, "strips", None)

    def timed(label, calls, fn):
        model.set_profiling(True)
        before = strips()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = (time.perf_counter() - start) / calls
        after = strips()
        phases = {k: v / calls for k, v in model.profile.items()}
        model.set_profiling(False)
        phases["other"] = max(0.0, wall - sum(phases.values()))
        taken = None if before is None else [(a - b) / calls for a, b in zip(after, before,
                                                                             strict=True)]
        return {"label": label, "wall": wall, "phases": phases, "strips": taken}

    rows = []
    for n in prompts:
        prompt = prompt_tokens(n, config.n_vocab, 1)
        run(prompt[:256], range(min(n, 256)), [0] * min(n, 256), [min(n, 256) - 1])  # warm-up
        rows.append(timed(f"prefill {n}", 1, lambda p=prompt, n=n: run(p, range(n), [0] * n,
                                                                         [n - 1])))
        rows[-1]["tokens"] = n
    filled = 0  # sequences whose first `depth` positions hold a prompt's K/V
    for batch in batches:
        if depth > 32:
            for s in range(filled, batch):
                context = prompt_tokens(depth, config.n_vocab, 5 + s)
                for p0 in range(0, depth, 256):
                    chunk = context[p0:p0 + 256]
                    run(chunk, range(p0, p0 + len(chunk)), [s] * len(chunk), [len(chunk) - 1])
            filled = max(filled, batch)
        tokens = prompt_tokens(batch, config.n_vocab, 3)
        run(tokens, [depth - 1] * batch, range(batch), range(batch))  # warm-up
        label = f"decode x{batch}" + (f" at {depth}" if depth != 32 else "")
        rows.append(timed(label, steps,
                          lambda t=tokens, b=batch: run(t, [depth] * b, range(b), range(b))))
        rows[-1]["tokens"] = batch
    return {"variant": hc.selected_variant(), "rows": rows}


def median_rows(samples: list[dict]) -> dict:
    """One result whose every wall time and phase is the median over `samples` (same rows)."""
    rows = []
    for i, row in enumerate(samples[0]["rows"]):
        each = [s["rows"][i] for s in samples]
        rows.append({"label": row["label"], "tokens": row["tokens"],
                     "wall": statistics.median(r["wall"] for r in each),
                     "walls": (min(r["wall"] for r in each), max(r["wall"] for r in each)),
                     "phases": {p: statistics.median(r["phases"][p] for r in each)
                                for p in row["phases"]},
                     "strips": strip_medians([r.get("strips") for r in each])})
    return {"variant": samples[0]["variant"], "rows": rows}


def strip_medians(samples: list) -> list[float] | None:
    """[strips a step, of them taken from another thread]: medians over the processes, or
    None where a build has no work stealing (before it: no count)."""
    if any(s is None for s in samples):
        return None
    return [statistics.median(s[i] for s in samples) for i in range(2)]


def strips_cell(strips: list[float] | None) -> str:
    """The table's cell: strips taken from another thread of all the step's batched strips."""
    if not strips or not strips[0]:
        return "-"
    return f"{strips[1]:.0f} of {strips[0]:.0f} ({100 * strips[1] / strips[0]:.1f} %)"


def run_order(builds: list, configs: list[str], repeats: int) -> list[tuple]:
    """(label, folder, configuration) of each process in turn: every build with every
    configuration, `repeats` times, the builds' order rotating from one repeat to the next (A B,
    B A, ...). Going first is not neutral: after a model file was written, the first processes
    ran slower in their untouched phases (docs/benchmarks.md)."""
    return [(label, folder, config) for i in range(max(1, repeats))
            for label, folder in rotated(builds, i) for config in configs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--configs", default="amx,avx512vnni")
    parser.add_argument("--prompts", default="256,2048")
    parser.add_argument("--batches", default="1,8,16")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokenizer")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the CPU engine of this git revision, alternating")
    parser.add_argument("--repeats", type=int, default=1,
                        help="processes per configuration and build (medians over them)")
    parser.add_argument("--depth", type=int, default=32,
                        help="positions each decoding sequence is in (filled by prefill first)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    prompts = [int(p) for p in args.prompts.split(",") if p]
    batches = [int(b) for b in args.batches.split(",") if b]
    if args.depth < 32:
        parser.error("--depth: at least 32 (the default: 32 positions in)")
    if args.worker:
        print(json.dumps(worker(args.model, args.threads, prompts, batches, args.steps,
                                args.depth)))
        return 0
    name, path = model_path(args.model, args.tokenizer)
    print(f"## {name}: per-phase time, {args.threads} threads, 4 KiB pages\n")
    builds: list[tuple[str, object]] = [("", None)]
    if args.baseline:
        short, folder = baseline.build(args.baseline)
        builds = [("working tree", None), (short, folder)]
    runs: dict[str, list[dict]] = {}
    for label, folder, config in run_order(builds, args.configs.split(","), args.repeats):
        variant, _, wide_min = config.partition("@")
        env = baseline.env_for(dict(os.environ, HETEROSERVE_KERNELS=variant,
                                    HETEROSERVE_HUGEPAGES="0"), folder)
        if wide_min:
            env["HETEROSERVE_WIDE_MIN"] = wide_min
        out = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_profile",
                              "--worker", "--model", str(path), "--threads",
                              str(args.threads), "--prompts", args.prompts, "--batches",
                              args.batches, "--steps", str(args.steps), "--depth",
                              str(args.depth)], env=env,
                             check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        if result["variant"] != variant:
            print(f"note: {config} ran as {result['variant']}")
        runs.setdefault(f"{config} {label}".strip(), []).append(result)
    results = {key: median_rows(samples) for key, samples in runs.items()}
    if args.baseline or args.repeats > 1:
        print(f"medians of {max(1, args.repeats)} processes per row\n")
    labels = [row["label"] for row in next(iter(results.values()))["rows"]]
    phases = list(next(iter(results.values()))["rows"][0]["phases"])
    for i, label in enumerate(labels):
        print(f"### {label}\n")
        print("| config | tok/s | tok/s range | ms | " + " | ".join(phases)
              + " | strips taken a step |")
        print("|---|---|---|---|" + "---|" * len(phases) + "---|")
        for config, res in results.items():
            row = res["rows"][i]
            cells = " | ".join(f"{1e3 * row['phases'][p]:.2f}" for p in phases)
            fastest, slowest = row["walls"]
            spread = f"{row['tokens'] / slowest:.1f}-{row['tokens'] / fastest:.1f}"
            print(f"| {config} | {row['tokens'] / row['wall']:.1f} | {spread} | "
                  f"{1e3 * row['wall']:.2f} | {cells} | {strips_cell(row.get('strips'))} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
