"""The benchmarks' process order: no engine keeps one place from pair to pair."""

from __future__ import annotations

from tests.bench.cpu_engine_vs_llamacpp import rotated


def test_every_engine_takes_every_place_once_per_round():
    engines = ("llama.cpp", "ik_llama.cpp", "heteroserve")
    orders = [rotated(engines, i) for i in range(3)]
    assert orders[0] == list(engines)
    for place in range(3):
        assert sorted(order[place] for order in orders) == sorted(engines)
    assert rotated(engines, 3) == orders[0]


def test_a_pair_alternates_its_first_place():
    assert [rotated({"a": 1, "b": 2}, i)[0] for i in range(4)] == ["a", "b", "a", "b"]
