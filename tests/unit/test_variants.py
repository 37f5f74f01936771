"""tests/variants.py: HETEROSERVE_KERNELS=V makes the suites see only the variants up to V."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import heteroserve_cpu as hc

ROOT = Path(__file__).resolve().parents[2]


def seen(forced: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "HETEROSERVE_KERNELS"}
    if forced is not None:
        env["HETEROSERVE_KERNELS"] = forced
    out = subprocess.run([sys.executable, "-c", "import tests.variants as v; "
                          "print(','.join(v.AVAILABLE), v.BATCH_INVARIANT)"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return [*out[0].split(","), out[1]]


def test_forcing_a_variant_limits_what_the_suites_see():
    granted = hc.available_variants().split(",")
    assert seen(None)[:-1] == granted
    assert seen("reference") == ["reference", "reference"]
    if "avx2" in granted:
        assert seen("avx2") == ["reference", "avx2", "avx2"]
    assert seen("no-such-variant")[:-1] == granted  # (the engine itself refuses that name)
