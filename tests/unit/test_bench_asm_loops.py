"""tests/bench/asm_loops.py: the loops it reports are GCC's, counted as the docs count them."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest

from tests.bench import asm_loops

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or not shutil.which("gcc"),
                                reason="compiles the x86 avx2 kernels with gcc")


def test_the_avx2_q4_0_loop_for_four_rows_holds_its_sums_in_registers():
    text = asm_loops.assembly(str(ROOT / "engines/cpu/src/x86_avx2.c"), "-mavx2 -mfma -mf16c")
    found = asm_loops.loops(text, "mm_q4_0")
    # one loop per tile width: 8 vpmaddubsw a group for each activation row
    assert sorted(loop.counted for loop in found) == [8, 16, 24, 32]
    four = next(loop for loop in found if loop.counted == 32)
    assert four.stack == 0 and four.instructions < 8 * 4 * 8  # under 8 a block and pair
    with pytest.raises(SystemExit, match="no function 'mm_q9_0'"):
        asm_loops.loops(text, "mm_q9_0")


def test_spills_are_counted(tmp_path):
    # plain int16 adds: GCC reassociates them into trees that spill (why the kernel uses adds)
    source = (ROOT / "engines/cpu/src/x86_avx2.c").read_text()
    plain = tmp_path / "plain.c"
    plain.write_text(source.replace("_mm256_adds_epi16", "_mm256_add_epi16"))
    found = asm_loops.loops(asm_loops.assembly(str(plain), "-mavx2 -mfma -mf16c"), "mm_q4_0")
    assert max(loop.stack for loop in found) > 0
