"""tests/bench/cpu_steal.sh: the share of CPU time the hypervisor took while a command ran, over
all CPUs and per CPU, each CPU's busy-loop time with BUSY=1, the command's own exit status, and
bad input refused before anything runs."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "bench" / "cpu_steal.sh"


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120, check=False)


def test_a_row_for_all_cpus_and_one_for_each_with_the_commands_output_before_them():
    result = run("echo", "the command ran")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the command ran\n")
    shares = dict(re.findall(r"^\| (all|\d+) \| (\d+\.\d\d) \|$", result.stdout, re.MULTILINE))
    cpus = {str(c) for c in range(os.cpu_count() or 1)}
    assert "all" in shares and set(shares) - {"all"} == cpus, result.stdout
    assert all(0.0 <= float(v) <= 100.0 for v in shares.values())


def test_busy_loop_times_every_cpu_the_script_may_run_on():
    result = run("true", BUSY="1")
    assert result.returncode == 0, result.stderr
    busy = re.findall(r"^\| (\d+) \| (\d+) \|$", result.stdout, re.MULTILINE)
    assert {int(c) for c, _ in busy} == os.sched_getaffinity(0), result.stdout
    assert all(int(ms) > 0 for _, ms in busy)


def test_the_commands_failure_is_its_exit_status_after_the_table():
    result = run("bash", "-c", "exit 3")
    assert result.returncode == 3 and "| all |" in result.stdout


def test_bad_input_is_refused_before_the_command_runs(tmp_path):
    marker = tmp_path / "ran"
    result = run("touch", str(marker), BUSY="yes")
    assert result.returncode == 2 and "BUSY 'yes': 0 or 1" in result.stderr
    assert not marker.exists()
