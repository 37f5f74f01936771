"""Kernel variants as the tests need them.

Variants with a matrix unit sum a block's products in one integer and scale it once (i8mm, and
amx for 16 to 47 rows), or compute in bf16 with float sums (amx's products of 48 rows or more
and its attention of a prefill chunk's tokens together); the vector variants scale per SIMD
lane. Their logits differ within float rounding, which the 8-bit activation quantization of
later layers can amplify to a few tenths of a logit - so with a matrix unit, a sequence computed
in a wide step can differ that much from the same sequence computed one token at a time, and
take another greedy path at a near-tie. Tests that compare results across batch shapes run on
the best vector variant, whose results do not depend on the batch; the matrix-unit variants are
held to the reference in the kernel tests and to the float reference and llama.cpp at the model
level."""

from __future__ import annotations

import os

import heteroserve_cpu as hc

# What this CPU grants, reference first. With HETEROSERVE_KERNELS naming one of them (the engine
# then selects it), only the variants up to it: the suites run as on a CPU that grants no more,
# e.g. `HETEROSERVE_KERNELS=avx2` on an AVX-512 machine as on an AVX2-only one.
_GRANTED = hc.available_variants().split(",")
_FORCED = os.environ.get("HETEROSERVE_KERNELS", "")
AVAILABLE = tuple(_GRANTED[:_GRANTED.index(_FORCED) + 1] if _FORCED in _GRANTED else _GRANTED)
BATCH_INVARIANT = next(v for v in ("avx512vnni", "avx2", "dotprod", "neon", "reference")
                       if v in AVAILABLE)
# The exact KV hand-off repeats the avx512vnni variant's arithmetic (prefill/exact.py): its tests
# need that variant, which CPUs without AVX-512 VNNI (and qemu-user) lack.
EXACT_HANDOFF_SKIP = "avx512vnni" not in AVAILABLE
