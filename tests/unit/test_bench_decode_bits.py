"""tests/bench/amx_decode_bits.py's refusals: bad arguments, and a CPU that does not grant AMX
(where it cannot compare anything, it says so rather than print a table)."""

from __future__ import annotations

import heteroserve_cpu as hc
import pytest

from tests.bench import amx_decode_bits


@pytest.mark.parametrize("bad", [["--sequences", "3,x"], ["--sequences", "0"],
                                 ["--threads", "0"]])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(SystemExit) as refused:
        amx_decode_bits.main(bad)
    assert refused.value.code == 2


@pytest.mark.skipif("amx" in hc.available_variants().split(","),
                    reason="this CPU grants AMX: the script runs instead of refusing")
def test_a_cpu_without_amx_is_refused(capsys):
    assert amx_decode_bits.main([]) == 2
    assert "does not grant AMX" in capsys.readouterr().err


def test_another_variant_needs_a_baseline_and_one_the_cpu_has(capsys):
    with pytest.raises(SystemExit) as refused:
        amx_decode_bits.main(["--variant", "avx2"])  # nothing to compare it against
    assert refused.value.code == 2
    assert amx_decode_bits.main(["--variant", "sve", "--baseline", "HEAD"]) == 2
    assert "has no sve variant" in capsys.readouterr().err
