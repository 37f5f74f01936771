"""The long-context benchmark's second peer: ik_llama.cpp's rows read, the better peer per depth."""

from __future__ import annotations

import pytest

from tests.bench.cpu_engine_long_context import STEPS, ik_rates, table


def test_ik_rows_give_the_decode_rate_at_each_depth():
    rows = [{"n_prompt": 512, "n_gen": STEPS, "avg_ts": 183.5, "test": f"tg{STEPS}@pp512"},
            {"n_prompt": 2048, "n_gen": STEPS, "avg_ts": 56.6, "test": f"tg{STEPS}@pp2048"},
            {"n_prompt": 512, "n_gen": 0, "avg_ts": 900.0, "test": "pp512"}]
    assert ik_rates(rows, [512, 2048]) == {512: 183.5, 2048: 56.6}


def test_a_depth_without_its_row_is_an_error():
    rows = [{"n_prompt": 512, "n_gen": STEPS, "avg_ts": 183.5}]
    with pytest.raises(RuntimeError, match=r"depths \[2048\]"):
        ik_rates(rows, [512, 2048])


def _rows(llama, ik, ours):
    def pairs(values):
        return [{512: a, 2048: b} for a, b in values]

    samples = {"llama.cpp": pairs(llama)}
    if ik is not None:
        samples["ik_llama.cpp"] = pairs(ik)
    samples["heteroserve"] = pairs(ours)
    return [("m.gguf", samples)]


def test_each_depth_is_compared_with_its_better_peer():
    lines = table(_rows(llama=[(100, 20), (110, 22), (90, 18)],
                        ik=[(150, 10), (140, 11), (160, 12)],
                        ours=[(300, 44), (310, 44), (290, 44)]), [512, 2048])
    ratio = next(line for line in lines if "better peer" in line)
    # 512: ik's median 150 against ours 300; 2048: llama.cpp's 20 against 44
    assert "| 2.00x vs ik (" in ratio and "| 2.20x vs llama.cpp (" in ratio
    assert "| m.gguf | ik_llama.cpp | 150.0 | 11.0 |" in lines


def test_one_peer_keeps_the_plain_ratio_row():
    lines = table(_rows(llama=[(100, 20)] * 3, ik=None, ours=[(150, 40)] * 3), [512, 2048])
    assert ("| m.gguf | heteroserve / llama.cpp (pair range) | 1.50x (1.50-1.50) | 2.00x "
            "(2.00-2.00) |") in lines
    assert not any("vs ik" in line for line in lines)
