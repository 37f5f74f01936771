"""cpu_engine_profile's summary of several processes: each figure the median, the rate's range
beside it (what tells an A/B's gain from the spread between processes)."""

from __future__ import annotations

import pytest

from tests.bench.cpu_engine_profile import main, median_rows, run_order, strip_medians, strips_cell


def sample(wall: float, attention: float) -> dict:
    return {"variant": "avx512vnni",
            "rows": [{"label": "decode x8", "tokens": 8, "wall": wall,
                      "phases": {"attention": attention, "down": wall / 2}}]}


def test_medians_and_the_range_of_the_wall_times():
    result = median_rows([sample(0.010, 0.003), sample(0.040, 0.001), sample(0.020, 0.002)])
    row = result["rows"][0]
    assert result["variant"] == "avx512vnni"
    assert row["wall"] == 0.020 and row["phases"] == {"attention": 0.002, "down": 0.010}
    assert row["walls"] == (0.010, 0.040)  # the fastest process's and the slowest's


def test_one_process_is_its_own_range():
    row = median_rows([sample(0.012, 0.004)])["rows"][0]
    assert row["wall"] == row["walls"][0] == row["walls"][1] == 0.012


def test_a_depth_under_the_default_32_positions_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "1.1b:q4_0", "--depth", "8"])
    assert exit_info.value.code == 2
    assert "--depth: at least 32" in capsys.readouterr().err


def test_the_builds_take_turns_going_first():
    order = run_order([("working tree", None), ("base", "/b")], ["amx", "avx512vnni"], 3)
    assert [(label, config) for label, _, config in order] == [
        ("working tree", "amx"), ("working tree", "avx512vnni"), ("base", "amx"),
        ("base", "avx512vnni"),
        ("base", "amx"), ("base", "avx512vnni"), ("working tree", "amx"),
        ("working tree", "avx512vnni"),
        ("working tree", "amx"), ("working tree", "avx512vnni"), ("base", "amx"),
        ("base", "avx512vnni")]
    assert run_order([("", None)], ["amx"], 0) == [("", None, "amx")]  # at least one


def test_strips_taken_are_medians_and_absent_for_a_build_without_them():
    assert strip_medians([[100, 3], [100, 9], [100, 5]]) == [100, 5]
    assert strip_medians([[100, 3], None]) is None
    assert strips_cell([1200, 30]) == "30 of 1200 (2.5 %)"
    assert strips_cell(None) == "-" and strips_cell([0, 0]) == "-"  # batch 1: no strips
