"""amx against avx512vnni, bit for bit, on decode steps of n sequences (a script, not a test; it
needs a CPU that grants AMX): the table behind docs/benchmarks.md's "amx's decode steps of
16-23 sequences". Each row: a SmolLM2-shaped synthetic model (`135m:q4_0`, `135m:q8_0`), n
sequences of 12 decode steps (one token each, random ids), every logit of both variants
compared; under model.h's HS_WIDE8_MIN (16; 24 before the sixth session of 2026-11-28) they
must be identical, from it they differ (the tile unit's products).

    python3 -m tests.bench.amx_decode_bits [--tokenizer JSON] [--sequences 3,8,15,16,20,23,24]
"""

from __future__ import annotations

import argparse
import sys

import heteroserve_cpu as hc
import numpy as np

from heteroserve_engines.cpu_engine.gguf_model import load_model
from tests.bench.cpu_engine_vs_llamacpp import model_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", help="SmolLM2's tokenizer as JSON (device runs)")
    ap.add_argument("--sequences", default="3,8,15,16,20,23,24")
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args(argv)
    try:
        counts = [int(n) for n in args.sequences.split(",")]
    except ValueError:
        ap.error(f"--sequences: comma-separated counts, not {args.sequences!r}")
    if not counts or min(counts) < 1 or args.threads < 1:
        ap.error("--sequences: counts of 1 or more; --threads: 1 or more")
    if "amx" not in hc.available_variants().split(","):
        print("amx_decode_bits: this CPU (or its kernel) does not grant AMX", file=sys.stderr)
        return 2
    print("| model | sequences | amx against avx512vnni |\n|---|---|---|")
    for spec in ("135m:q4_0", "135m:q8_0"):
        _label, path = model_path(spec, args.tokenizer)
        models = [load_model(path, hc.Pool([], args.threads), kernels=k)[0]
                  for k in ("amx", "avx512vnni")]
        rng = np.random.default_rng(0)
        for n in counts:
            toks = rng.integers(0, 49152, size=(12, n)).astype(np.int32)
            seqs = np.arange(n, dtype=np.int32)
            outs = []
            for model in models:
                model.alloc_kv(n, 16)  # 12 positions: one block a sequence
                outs.append(np.stack([model.forward(toks[i], np.full(n, i, np.int32), seqs,
                                                    seqs.reshape(n, 1), seqs)
                                      for i in range(12)]))
            same = np.array_equal(outs[0], outs[1])
            verdict = "identical" if same else \
                f"differ (max |diff| {np.abs(outs[0] - outs[1]).max():.3g})"
            print(f"| {spec} | {n} | {verdict} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
