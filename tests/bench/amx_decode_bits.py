"""amx against avx512vnni, bit for bit, on decode steps of n sequences (a script, not a test; it
needs a CPU that grants AMX): the table behind docs/benchmarks.md's "amx's decode steps of
16-23 sequences". Each row: a SmolLM2-shaped synthetic model (`135m:q4_0`, `135m:q8_0`), n
sequences of 12 decode steps (one token each, random ids), every logit of both variants
compared; under model.h's HS_WIDE8_MIN (16; 24 before the sixth session of 2026-11-28) they
must be identical, from it they differ (the tile unit's products).

`--baseline REV` (a commit, or a folder holding a copy of engines/cpu, as in cpu_engine_profile)
adds a column: the working tree's amx against REV's amx on the same steps, run in a child process
with that engine (tests/bench/baseline.py). A change that should keep every bit of the model's
decode steps (a refactor of model.c, a kernel's new instruction order) must read "identical" in
every row. Exit status 1 where it does not. `--variant V --baseline REV` makes the same check for
another variant (avx512vnni, avx2, ...: on a CPU without AMX too), its column alone.

    python3 -m tests.bench.amx_decode_bits [--tokenizer JSON] [--sequences 3,8,15,16,20,23,24]
        [--baseline REV] [--threads N] [--variant amx]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tests.bench import baseline
from tests.bench.cpu_engine_vs_llamacpp import model_path

SPECS = ("135m:q4_0", "135m:q8_0")


def steps(spec: str, tokenizer: str | None, counts: list[int], threads: int,
          variants: tuple[str, ...]) -> dict[str, list[np.ndarray]]:
    """{variant: [logits of the 12 steps, one array per count]} on the model of `spec`."""
    import heteroserve_cpu as hc

    from heteroserve_engines.cpu_engine.gguf_model import load_model

    _label, path = model_path(spec, tokenizer)
    out: dict[str, list[np.ndarray]] = {}
    for k in variants:
        model = load_model(path, hc.Pool([], threads), kernels=k)[0]
        rng = np.random.default_rng(0)  # the same ids for every variant and build
        out[k] = []
        for n in counts:
            toks = rng.integers(0, 49152, size=(12, n)).astype(np.int32)
            seqs = np.arange(n, dtype=np.int32)
            model.alloc_kv(n, 16)  # 12 positions: one block a sequence
            out[k].append(np.stack([model.forward(toks[i], np.full(n, i, np.int32), seqs,
                                                  seqs.reshape(n, 1), seqs)
                                    for i in range(12)]))
    return out


def verdict(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    same = np.array_equal(a, b)
    return same, "identical" if same else f"differ (max |diff| {np.abs(a - b).max():.3g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="SmolLM2's tokenizer as JSON (device runs)")
    ap.add_argument("--sequences", default="3,8,15,16,20,23,24")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--baseline", metavar="REV", help="also against REV's amx, bit for bit")
    ap.add_argument("--variant", default="amx",
                    help="the variant compared against REV's (another than amx: --baseline only)")
    ap.add_argument("--dump", help=argparse.SUPPRESS)  # the baseline child: amx's steps, as npz
    args = ap.parse_args(argv)
    variant = args.variant
    try:
        counts = [int(n) for n in args.sequences.split(",")]
    except ValueError:
        ap.error(f"--sequences: comma-separated counts, not {args.sequences!r}")
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts) or args.threads < 1:
        ap.error("--sequences: distinct counts of 1 or more; --threads: 1 or more")
    if variant != "amx" and not args.baseline and not args.dump:
        ap.error("--variant: another variant than amx is compared against --baseline REV only")
    if args.dump:  # in the child, with the baseline's engine
        baseline.use()
        arrays = {}
        for spec in SPECS:
            got = steps(spec, args.tokenizer, counts, args.threads, (variant,))[variant]
            arrays.update({f"{spec}/{n}": logits for n, logits in zip(counts, got, strict=True)})
        np.savez(args.dump, **arrays)
        return 0
    import heteroserve_cpu as hc

    if variant not in hc.available_variants().split(","):
        grant = "does not grant AMX" if variant == "amx" else f"has no {variant} variant"
        print(f"amx_decode_bits: this CPU (or its kernel) {grant}", file=sys.stderr)
        return 2
    theirs, label = None, None
    if args.baseline:
        label, folder = baseline.build(args.baseline)
        with tempfile.TemporaryDirectory() as tmp:
            dump = Path(tmp) / "baseline.npz"
            cmd = [sys.executable, "-m", "tests.bench.amx_decode_bits", "--dump", str(dump),
                   "--sequences", args.sequences, "--threads", str(args.threads),
                   "--variant", variant]
            if args.tokenizer:
                cmd += ["--tokenizer", args.tokenizer]
            subprocess.run(cmd, env=baseline.env_for(dict(os.environ), folder), check=True)
            with np.load(dump) as npz:
                theirs = {key: npz[key] for key in npz.files}
    pair = variant == "amx"  # amx against avx512vnni too
    columns = (["amx against avx512vnni"] if pair else []) + (
        [f"{variant} against {label}'s {variant}"] if label else [])
    print("| model | sequences | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    all_same = True
    for spec in SPECS:
        ours = steps(spec, args.tokenizer, counts, args.threads,
                     ("amx", "avx512vnni") if pair else (variant,))
        for i, n in enumerate(counts):
            row = f"| {spec} | {n} |"
            if pair:
                row += f" {verdict(ours['amx'][i], ours['avx512vnni'][i])[1]} |"
            if theirs is not None:
                same, words = verdict(ours[variant][i], theirs[f"{spec}/{n}"])
                all_same &= same
                row += f" {words} |"
            print(row, flush=True)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
