"""The pool-spin benchmarks' --spins entries (tests/bench/cpu_engine_shared_cores.py and
cpu_engine_spin_ab.py): each names the pool's spin variables, bad entries are refused before any
process runs, and the A/B reads the stolen share from /proc/stat's steal column."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench import cpu_engine_spin_ab
from tests.bench.cpu_engine_shared_cores import spin_env

ROOT = Path(__file__).resolve().parents[2]


def test_default_leaves_both_variables_to_the_pool():
    assert spin_env("default") == {}


def test_one_value_sets_the_spin_and_a_pair_sets_the_long_spin_too():
    assert spin_env("10000") == {"HETEROSERVE_POOL_SPIN_US": "10000"}
    assert spin_env("200/0") == {"HETEROSERVE_POOL_SPIN_US": "200",
                                 "HETEROSERVE_POOL_SPIN_ALONE_US": "0"}


@pytest.mark.parametrize("entry", ["", "fast", "-5", "200/", "200/x", "/5000", "1/2/3"])
def test_bad_entries_are_refused(entry):
    with pytest.raises(SystemExit, match="--spins entry"):
        spin_env(entry)


def test_the_ab_refuses_a_bad_entry_before_it_loads_anything():
    result = subprocess.run([sys.executable, "-m", "tests.bench.cpu_engine_spin_ab", "--spins",
                             "default,soon"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0
    assert "--spins entry 'soon'" in result.stderr
    assert "process" not in result.stdout


def test_steal_and_all_come_from_the_first_line_of_proc_stat(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open",
                        lambda p, *a, **k: real_open(stat if p == "/proc/stat" else p, *a, **k))
    assert cpu_engine_spin_ab.stat_times() == (35, 1000)
