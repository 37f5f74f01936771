"""The benchmarks' memory sampler: counters only, never a walk of the process's page tables."""

from __future__ import annotations

import sys

import pytest

from tests.bench import cpu_engine_vs_llamacpp as bench

# A child that holds 64 MiB of its own (touched) memory for `seconds`, then exits.
HOLD = ("import sys, time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
        "time.sleep(float(sys.argv[1]))")
# The same on transparent huge pages: 64 MiB of an anonymous mapping advised MADV_HUGEPAGE.
# Private: Python's default anonymous mmap is shared, shmem, whose huge pages are another setting.
PRIVATE = "flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS"
HOLD_HUGE = (f"import mmap, sys, time; m = mmap.mmap(-1, 66 << 20, {PRIVATE}); "
             "m.madvise(mmap.MADV_HUGEPAGE); m[::4096] = b'x' * len(m[::4096]); "
             "time.sleep(float(sys.argv[1]))")


def thp_granted() -> bool:
    """Whether this machine backs an advised private mapping with huge pages."""
    probe = (f"import mmap, os; m = mmap.mmap(-1, 8 << 20, {PRIVATE}); "
             "m.madvise(mmap.MADV_HUGEPAGE); m[::4096] = b'x' * len(m[::4096]); "
             "print(open(f'/proc/{os.getpid()}/smaps_rollup').read())")
    out = bench.subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    return any(line.startswith("AnonHugePages:") and int(line.split()[1]) > 0
               for line in out.splitlines())


def test_anonymous_memory_is_seen_without_reading_smaps_rollup(monkeypatch):
    walked, opened = [], []
    monkeypatch.setattr(bench, "_anon_huge_kib", lambda pid: walked.append(pid) or 0)
    real_path = bench.Path

    def recorded(*parts):
        opened.append("/".join(map(str, parts)))
        return real_path(*parts)

    monkeypatch.setattr(bench, "Path", recorded)
    *_, mem = bench.run_sampled([sys.executable, "-c", HOLD, "1.5"], {})
    assert walked == []
    assert opened, "the sampler read nothing from /proc"
    assert not [path for path in opened if "smaps" in path]
    assert mem["anon_mib"] >= 64


def test_huge_pages_are_the_machine_count_above_its_start(monkeypatch):
    # the machine's count as the sampler reads it: 100 MiB before the process, up to 164 MiB
    # while it runs, then below its start (another process let go of some): 64 MiB, not more
    counts = iter([100 << 10] + [164 << 10] * 3 + [90 << 10] * 1000)
    monkeypatch.setattr(bench, "_system_huge_kib", lambda: next(counts))
    *_, mem = bench.run_sampled([sys.executable, "-c", HOLD, "1"], {})
    assert mem["huge_mib"] == 64


@pytest.mark.skipif(not thp_granted(),
                    reason="no transparent huge pages for an advised mapping on this machine")
def test_huge_pages_are_seen_from_the_machine_count():
    *_, mem = bench.run_sampled([sys.executable, "-c", HOLD_HUGE, "1.5"], {})
    # 64 MiB advised, at least 30 of them in whole aligned 2 MiB pages (the kernel may place the
    # mapping unaligned, or be short of free huge pages for some)
    assert mem["huge_mib"] >= 30
    assert mem["anon_mib"] >= 64


def test_a_failing_command_raises_with_its_output():
    with pytest.raises(bench.subprocess.CalledProcessError) as err:
        bench.run_sampled([sys.executable, "-c", "import sys; print('out'); sys.exit(3)"], {})
    assert err.value.returncode == 3
    assert err.value.output.strip() == "out"
