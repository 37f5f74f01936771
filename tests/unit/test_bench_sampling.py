"""The benchmarks' memory sampler: RssAnon often, the page-table walk of smaps_rollup seldom."""

from __future__ import annotations

import itertools
import sys

from tests.bench import cpu_engine_vs_llamacpp as bench

# A child that holds 64 MiB of its own (touched) memory for `seconds`, then exits.
HOLD = ("import sys, time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
        "time.sleep(float(sys.argv[1]))")


def test_huge_page_reads_double():
    assert list(itertools.islice(bench.huge_page_reads(), 6)) == [1, 2, 4, 8, 16, 32]


def test_a_five_second_process_is_walked_three_times_and_its_memory_still_seen(monkeypatch):
    walked = []
    real = bench._anon_huge_kib

    def counted(pid):
        walked.append(pid)
        return real(pid)

    monkeypatch.setattr(bench, "_anon_huge_kib", counted)
    *_, mem = bench.run_sampled([sys.executable, "-c", HOLD, "5"], {})
    # at 1, 2 and 4 s (every second, as before, would be 5 walks)
    assert len(walked) == 3
    assert mem["anon_mib"] >= 64
